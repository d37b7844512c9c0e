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

``distcheck certify`` with no target runs every ``[[tool.distcheck.certify]]`` entry;
:func:`config_rows` gives ``distcheck check`` the same runs as report rows. The file is read
with :mod:`tomllib`; a key that is not known, or a value of the wrong type, is a ConfigError
naming the file, the entry and the key.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distcheck.errors import ConfigError

__all__ = ["TargetEntry", "CertifyConfig", "load_config", "config_rows", "find_pyproject", "target_rows",
           "importable_from_current_folder"]

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
    """``[tool.distcheck]`` of one file: run settings and the targets."""

    path: Path | None
    targets: list[TargetEntry]
    profile: str = "ci"
    seed: int | None = None
    timeout: float = 120.0


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
            raise ConfigError(f"{where}.{key}", value, f"must be a {' or '.join(k.__name__ for k in kinds)}")


def load_config(path: str | Path | None = None) -> CertifyConfig:
    """Read ``[tool.distcheck]`` from ``path`` (default: :func:`find_pyproject`).

    Returns a config with no targets when there is no file or no table.
    Raises ConfigError for unreadable TOML, unknown keys or wrongly typed values.
    """
    path = Path(path) if path is not None else find_pyproject()
    if path is None:
        return CertifyConfig(path=None, targets=[])
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot be read: {exc.strerror or exc}") from None
    table: Any = data.get("tool", {}).get("distcheck", {})
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
                         timeout=float(table.get("timeout", 120.0)))


def config_rows(path: str | Path | None = None, *, profile: str | None = None, seed: int | None = None,
                backend: str | None = None, world_sizes: list[int] | None = None) -> list:
    """Certify every target of ``[tool.distcheck]`` and return one report row per verdict
    (:class:`~distcheck.report.CheckResult`), for ``distcheck check``. The keyword arguments
    override the file's settings; no file or no targets gives no rows.

    A row's check is ``target contract.property[dtype]`` (:func:`target_rows`): it names the target,
    as under ``distcheck certify``, so that no two rows read the same. The rows of a target none of
    whose properties could fail carry ``extra["nothing_can_fail"]`` (``distcheck check`` exits 2).
    Targets are imported from the current folder, as ``distcheck certify`` imports them."""
    from distcheck.certify.engine import certify

    cfg = load_config(path)
    importable_from_current_folder()
    rows: list = []
    for entry in cfg.targets:
        cert = certify(entry.target, entry.contract, world_sizes=world_sizes or entry.world_sizes,
                       backend=backend or entry.backend, examples=entry.examples,
                       seed=seed if seed is not None else cfg.seed, profile=profile or cfg.profile,
                       dtypes=entry.dtypes, options=entry.options, timeout_s=cfg.timeout)
        rows += target_rows(cert)
    return rows


def target_rows(cert) -> list:
    """The rows of ``cert`` (a :class:`~distcheck.certify.certificate.Certification` of a
    ``[tool.distcheck]`` target), each check named ``target contract.property[dtype]``; when no
    property could fail, each row's ``extra["nothing_can_fail"]`` says why."""
    from dataclasses import replace

    from distcheck.certify.certificate import NOTHING_CAN_FAIL

    target = cert.target
    why = {} if cert.can_fail else {"nothing_can_fail": f"{target} under {cert.contract}: {NOTHING_CAN_FAIL} ("
                                                       f"{'; '.join(cert.skip_reasons()) or 'no property ran'})"}
    return [replace(r, check=f"{target} {r.check}", extra={**r.extra, **why}) for r in cert.rows()]


def importable_from_current_folder() -> None:
    """Put the current folder first on ``sys.path`` (once), so that ``module:object`` targets resolve
    from it, as ``python -m`` resolves modules."""
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
