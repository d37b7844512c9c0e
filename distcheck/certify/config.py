"""Targets listed in a project's ``pyproject.toml``, under ``[tool.distcheck]``.

    [tool.distcheck]
    backend = "gloo"            # defaults for every target (each optional)
    world-sizes = [2, 4]
    profile = "ci"

    [[tool.distcheck.certify]]
    target = "mypkg.layers:MyColumnParallel"
    contract = "column-parallel-linear"
    world-sizes = [2, 4]        # per target: world-sizes, backend, dtypes, examples, options
    options = { gather_output = false }

``distcheck certify`` with no target runs every ``[[tool.distcheck.certify]]`` entry; with a target it
reads and checks the file all the same, and the table's settings (``timeout``, ``profile``, ``seed``)
and defaults (``world-sizes``, ``backend``, ``dtypes``, ``examples``) apply to that target;
:func:`config_rows` gives ``distcheck check`` the same runs as report rows. The file is read
with :mod:`tomllib`, only when it is a regular file of at most 4 MiB
(:func:`distcheck.core.files.read_regular_file`, the reader of answer keys too). Every value is
checked with the helpers that check the command line's flags (:mod:`distcheck.core.validate`): a key
that is not known, a value of the wrong type or out of range (``timeout = nan``, ``world-sizes = []``
or with repeats, ``seed`` of 5,000 digits) is a ConfigError naming the file, the entry and the key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import ConfigError, UnknownQuantityError
from distcheck.core.files import FileRefused, read_regular_file
from distcheck.core.validate import (
    check_choice,
    check_nonnegative_int,
    check_positive_int,
    check_world_sizes,
)

if TYPE_CHECKING:
    from distcheck.certify.certificate import Certification
    from distcheck.report import CheckResult

__all__ = ["TargetEntry", "CertifyConfig", "load_config", "check_entries", "config_rows", "find_pyproject",
           "target_rows", "importable_from_current_folder"]

_DEFAULT_KEYS = {"backend": str, "world-sizes": list, "examples": int, "profile": str, "seed": int,
                 "dtypes": list, "timeout": (int, float)}
_ENTRY_KEYS = {"target": str, "contract": str, "options": dict, **{k: v for k, v in _DEFAULT_KEYS.items()
                                                                     if k not in ("profile", "seed", "timeout")}}


@dataclass
class TargetEntry:
    """One ``[[tool.distcheck.certify]]`` entry, completed with the table's defaults."""

    target: str
    contract: str
    world_sizes: list[int] = field(default_factory=lambda: [2])
    backend: str = "gloo"
    dtypes: list[str] | None = None
    examples: int | None = None
    options: dict = field(default_factory=dict)


@dataclass
class CertifyConfig:
    """``[tool.distcheck]`` of one file: run settings, the defaults of every target (a command-line
    target's too: ``world_sizes``, ``backend``, ``dtypes``, ``examples``) and the targets."""

    path: Path | None
    targets: list[TargetEntry]
    profile: str = "ci"
    seed: int | None = None
    timeout: float = 120.0
    world_sizes: list[int] = field(default_factory=lambda: [2])
    backend: str = "gloo"
    dtypes: list[str] | None = None
    examples: int | None = None

    @property
    def entries_field(self) -> str:
        """What errors call the file's entries: ``<path>: [[tool.distcheck.certify]]``."""
        return f"{self.path}: [[tool.distcheck.certify]]"


def find_pyproject(start: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` in ``start`` (default: the current folder) or a parent folder."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _check_keys(where: str, table: dict, known: dict) -> None:
    for key, value in table.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
            raise ConfigError(where, key, f"is not a key of {where}{hint}")
        kind = known[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{where}.{key}", value, f"must be {'an' if names[0] in 'aeiou' else 'a'} {names}")
        _check_value(f"{where}.{key}", key, value)


def _check_value(field_name: str, key: str, value: Any) -> None:
    """The rule of ``key``'s value: the one its command-line flag is held to."""
    from distcheck.engine.profiles import PROFILES
    from distcheck.runners.backends import BACKENDS, check_timeout

    if key == "world-sizes":
        check_world_sizes(field_name, value)
    elif key == "examples":
        check_positive_int(field_name, value)
    elif key == "seed":
        check_nonnegative_int(field_name, value)
    elif key == "timeout":
        check_timeout(field_name, value)
    elif key == "backend":
        check_choice(field_name, value, BACKENDS)
    elif key == "profile":
        check_choice(field_name, value, tuple(PROFILES))
    elif key == "dtypes":
        if not value or not all(isinstance(d, str) for d in value):
            raise ConfigError(field_name, value, "must be a non-empty list of dtype names (float64, float32, bfloat16)")
    elif key in ("target", "contract") and not value.strip():
        raise ConfigError(field_name, value, "must not be empty")


#: the most digits an integer may have (Python's own limit on reading one from text)
_MAX_DIGITS = 4300
_LONG_INT = re.compile(r"(?m)^[ \t]*([A-Za-z0-9_.\"'-]+)[ \t]*=[ \t]*[+-]?[0-9][0-9_]{" + str(_MAX_DIGITS) + ",}")


class _Digits:
    """An integer shown by its length alone (``<an integer of 5,000 digits>``)."""

    def __init__(self, text: str):
        self.n = sum(ch.isdigit() for ch in text)

    def __repr__(self) -> str:
        return f"<an integer of {self.n:,} digits>"


def _parse_toml(path: Path, text: str, field_name: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(field_name, str(path), f"is not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer longer than Python reads from text (tomllib does not wrap it)
        hit = _LONG_INT.search(text)
        if hit is None:
            raise ConfigError(field_name, str(path), f"is not valid TOML: {exc}") from None
        line = text.count("\n", 0, hit.start()) + 1
        number = text[hit.end(1):hit.end()].split("=", 1)[1]
        raise ConfigError(f"{path}:{line}: {hit.group(1).strip(chr(34) + chr(39))}", _Digits(number),
                          f"must be an integer of at most {_MAX_DIGITS} digits") from None


def load_config(path: str | Path | None = None, *, field: str = "config") -> CertifyConfig:
    """Read ``[tool.distcheck]`` from ``path`` (default: :func:`find_pyproject`).

    Returns a config with no targets when there is no file or no table.
    Raises ConfigError naming ``field`` (the flag that named the file: ``--config``) for a path that
    is not a regular file of at most 4 MiB (a folder, a named pipe, ``/dev/zero``, a dangling link),
    for text that is not UTF-8 or not TOML, and naming the key for an unknown key or a wrongly typed
    or out-of-range value (the rules of the matching flags).
    """
    path = Path(path) if path is not None else find_pyproject()
    if path is None:
        return CertifyConfig(path=None, targets=[])
    try:
        raw = read_regular_file(path, what="a config file", limit_name="the config-file limit")
    except FileRefused as exc:
        raise ConfigError(field, str(path), exc.reason) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, str(path), f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    data = _parse_toml(path, text, field)
    tool: Any = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: tool", tool, "must be a table")
    table: Any = tool.get("distcheck", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: tool.distcheck", table, "must be a table")
    where = f"{path}: [tool.distcheck]"
    entries = table.get("certify", [])
    _check_keys(where, {k: v for k, v in table.items() if k != "certify"}, _DEFAULT_KEYS)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{where}.certify", entries, "must be an array of tables ([[tool.distcheck.certify]])")
    defaults = {k: v for k, v in table.items() if k != "certify"}
    targets = []
    for i, entry in enumerate(entries):
        here = f"{path}: [[tool.distcheck.certify]] #{i + 1}"
        _check_keys(here, entry, _ENTRY_KEYS)
        for required in ("target", "contract"):
            if required not in entry:
                raise ConfigError(here, required, "is required (each entry names a target and a contract)")
        merged = {**{k: v for k, v in defaults.items() if k in _ENTRY_KEYS}, **entry}
        targets.append(TargetEntry(target=merged["target"], contract=merged["contract"],
                                   world_sizes=list(merged.get("world-sizes", [2])),
                                   backend=merged.get("backend", "gloo"), dtypes=merged.get("dtypes"),
                                   examples=merged.get("examples"), options=dict(merged.get("options", {}))))
    return CertifyConfig(path=path, targets=targets, profile=table.get("profile", "ci"), seed=table.get("seed"),
                         timeout=float(table.get("timeout", 120.0)), world_sizes=list(table.get("world-sizes", [2])),
                         backend=table.get("backend", "gloo"), dtypes=table.get("dtypes"),
                         examples=table.get("examples"))


def check_entries(entries: list[TargetEntry], where: str = "[[tool.distcheck.certify]]") -> None:
    """Check, before anything runs, what each entry names: a registered contract, options that
    contract declares with values in their range, dtypes it accepts. Raises UnknownQuantityError
    (a contract or an option that does not exist, with close matches, else the known names) or
    ConfigError, each naming the entry: ``where`` (the file, ``pyproject.toml: [[tool.distcheck.certify]]``),
    its number and its target (``... #2 (target 'pkg:Layer'): option max_stages=1000000 must be <= 32``);
    only the one entry of ``where="command line"`` is not named."""
    from distcheck.engine.contracts.contract import check_dtypes, get_contract

    for i, entry in enumerate(entries):
        head = f"{where} #{i + 1} (target {entry.target!r}): " if len(entries) > 1 or where != "command line" else ""
        try:
            contract = get_contract(entry.contract)
        except UnknownQuantityError as exc:
            close = difflib.get_close_matches(entry.contract, exc.known, n=3)
            raise UnknownQuantityError(exc.name, exc.known, kind=exc.kind, where=head, list_known=not close) from None
        try:
            contract.parse_options(entry.options)
            check_dtypes(entry.dtypes, contract)
        except UnknownQuantityError as exc:
            raise UnknownQuantityError(exc.name, exc.known, kind=exc.kind, where=head, list_known=True) from None
        except ConfigError as exc:
            raise ConfigError(f"{head}{exc.field}", exc.value, exc.rule) from None


def config_rows(path: str | Path | None = None, *, profile: str | None = None, seed: int | None = None,
                backend: str | None = None, world_sizes: list[int] | None = None) -> list:
    """Certify every target of ``[tool.distcheck]`` and return one report row per verdict
    (:class:`~distcheck.core.results.CheckResult`), for ``distcheck check``. The keyword arguments
    override the file's settings; no file or no targets gives no rows.

    A row's check is ``target contract.property[dtype]`` (:func:`target_rows`): it names the target,
    as under ``distcheck certify``, so that no two rows read the same. The rows of a target none of
    whose properties could fail carry ``extra["nothing_can_fail"]`` (``distcheck check`` exits 2).
    Targets are imported from the current folder, as ``distcheck certify`` imports them."""
    from distcheck.certify.engine import certify

    cfg = load_config(path)
    importable_from_current_folder()
    check_entries(cfg.targets, cfg.entries_field)
    rows: list = []
    for entry in cfg.targets:
        cert = certify(entry.target, entry.contract, world_sizes=world_sizes or entry.world_sizes,
                       backend=backend or entry.backend, examples=entry.examples,
                       seed=seed if seed is not None else cfg.seed, profile=profile or cfg.profile,
                       dtypes=entry.dtypes, options=entry.options, timeout_s=cfg.timeout)
        rows += target_rows(cert)
    return rows


def target_rows(cert: Certification) -> list[CheckResult]:
    """The rows of ``cert`` (a :class:`~distcheck.certify.certificate.Certification` of a
    ``[tool.distcheck]`` target), each check named ``target contract.property[dtype]``; when no
    property could fail, each row's ``extra["nothing_can_fail"]`` says why."""
    from dataclasses import replace

    from distcheck.certify.certificate import NOTHING_CAN_FAIL

    target = cert.target
    why = {} if cert.can_fail else {"nothing_can_fail": f"{target} under {cert.contract}: {NOTHING_CAN_FAIL} ("
                                                       f"{'; '.join(cert.skip_reasons()) or 'no property ran'})"}
    rows = [replace(r, check=f"{target} {r.check}", extra={**r.extra, **why}) for r in cert.rows()]
    for r in rows:  # a crash's checks, named as the rows are
        if r.extra.get("took_down"):
            r.extra["took_down"] = [f"{target} {c}" for c in r.extra["took_down"]]
    return rows


def importable_from_current_folder() -> None:
    """Put the current folder first on ``sys.path`` (once), so that ``module:object`` targets resolve
    from it, as ``python -m`` resolves modules."""
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
