"""The zoo of real silent bugs: public reports of distributed-training bugs, each reproduced as a target of an
existing contract, with its fixed twin (``distcheck zoo``; the entries live in the repository's ``zoo/`` folder,
shipped in the sdist, not in the wheel).

An entry is a module ``zoo/<name>.py`` (names starting with ``_`` are helpers, not entries) that defines
``ENTRY = Entry(...)``: the buggy target, its fixed twin and the metadata (public reference, library and
versions, bug class, contract and the property that must catch it). :func:`run_entry` certifies both on a gloo
world: the bug is *caught* when the named property FAILs, the twin *certified* when every property passes.
An entry whose library is not installed (``requires``) is a skip, which ``distcheck zoo`` counts as not checked
(exit 1) unless ``--allow-skips``.

Importing this module does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distcheck.core.errors import ConfigError

__all__ = ["Entry", "ZooRow", "check_entry", "discover", "missing", "run_entry", "to_json", "to_markdown", "to_table"]

#: ``owner/repo#N``: an issue or pull request on GitHub
GITHUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)#(?P<n>[1-9]\d*)$")
#: a non-GitHub source: ``blog: <title>`` or ``paper: <title>, <section>``
TEXT_REF = re.compile(r"^(?:blog|paper|docs): \S.*$")
#: seconds one world step of an entry's run may take (the contract's timeout)
TIMEOUT_S = 120.0
#: how an entry reproduces its bug
REPRODUCTIONS = ("library code", "plain torch re-creation")


@dataclass(frozen=True)
class Entry:
    """One public silent bug, reproduced.

    Fields: ``reference``: ``owner/repo#N`` (GitHub issue or pull request) or ``blog: ...`` / ``paper: ...``;
    ``url``: where a reader opens it (for ``owner/repo#N``, ``https://github.com/owner/repo/(issues|pull)/N``);
    ``library`` and ``versions`` affected; ``bug_class`` (a short phrase); ``contract`` (a registered contract
    name) and ``property`` (the one that must FAIL on ``bug``); ``bug`` and ``fixed``: the two targets (objects
    or ``module:object``); ``summary``: what the bug does; ``reproduction``: one of :data:`REPRODUCTIONS`
    (the library's own code, or its logic re-created in plain torch); ``options``: contract options for both
    runs; ``world_size`` (default 2) and ``examples`` (Hypothesis examples per property, default 4);
    ``requires``: modules that must import (the ``libs`` extra), else the entry is skipped; ``dtypes``: the
    dtypes certified (default: the contract's)."""

    reference: str
    url: str
    library: str
    versions: str
    bug_class: str
    contract: str
    property: str
    bug: Any
    fixed: Any
    summary: str
    reproduction: str
    options: dict = field(default_factory=dict)
    world_size: int = 2
    examples: int = 4
    requires: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()


@dataclass
class ZooRow:
    """The outcome of one entry: ``caught`` (the bug FAILed ``property``), ``certified`` (the twin passed every
    property); both ``None`` when skipped (``skip`` says why). ``detail``: the bug's shrunk counterexample, or
    what went wrong. ``seconds``: wall time of both runs."""

    name: str
    entry: Entry
    caught: bool | None = None
    certified: bool | None = None
    detail: str = ""
    skip: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.caught) and bool(self.certified)


def check_entry(name: str, entry: Any) -> Entry:
    """Return ``entry``; raise ConfigError naming the field when ``entry`` (the ``ENTRY`` of ``zoo/<name>.py``)
    is incomplete or its reference is not well formed."""
    if not isinstance(entry, Entry):
        raise ConfigError(f"zoo/{name}.py ENTRY", type(entry).__name__, "must be a distcheck.zoo.Entry")
    for f in ("reference", "url", "library", "versions", "bug_class", "contract", "property", "summary"):
        value = getattr(entry, f)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"zoo/{name}.py ENTRY.{f}", value, "must be a non-empty string")
    m = GITHUB_REF.match(entry.reference)
    if m:
        base = f"https://github.com/{m['repo']}/"
        if entry.url not in (f"{base}issues/{m['n']}", f"{base}pull/{m['n']}"):
            raise ConfigError(f"zoo/{name}.py ENTRY.url", entry.url,
                              f"must be {base}issues/{m['n']} or {base}pull/{m['n']} (the reference's page)")
    elif TEXT_REF.match(entry.reference):
        if not entry.url.startswith("https://"):
            raise ConfigError(f"zoo/{name}.py ENTRY.url", entry.url, "must be an https:// address")
    else:
        raise ConfigError(f"zoo/{name}.py ENTRY.reference", entry.reference,
                          "must be owner/repo#N or start with 'blog: ', 'paper: ' or 'docs: '")
    if entry.reproduction not in REPRODUCTIONS:
        raise ConfigError(f"zoo/{name}.py ENTRY.reproduction", entry.reproduction, f"must be one of {REPRODUCTIONS}")
    if entry.bug is None or entry.fixed is None or entry.bug is entry.fixed:
        raise ConfigError(f"zoo/{name}.py ENTRY.fixed", entry.fixed, "bug and fixed must be two different targets")
    if not isinstance(entry.world_size, int) or entry.world_size < 2:
        raise ConfigError(f"zoo/{name}.py ENTRY.world_size", entry.world_size, "must be an integer >= 2")
    if not isinstance(entry.examples, int) or entry.examples < 1:
        raise ConfigError(f"zoo/{name}.py ENTRY.examples", entry.examples, "must be an integer >= 1")
    return entry


def default_folder() -> Path:
    """``zoo/`` under the current folder (the repository's root)."""
    return Path.cwd() / "zoo"


def entry_names(folder: Path) -> list[str]:
    """The entries' names: every ``*.py`` in ``folder`` whose name does not start with ``_``, sorted."""
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def discover(folder: Path | None = None, only: list[str] | None = None) -> dict[str, Entry]:
    """Import every entry of ``folder`` (default ``./zoo``) as the package ``zoo`` (its parent first on
    ``sys.path``) and return ``{name: ENTRY}``, checked by :func:`check_entry`. ``only``: these names.

    Raises ConfigError: no such folder, an unknown name in ``only``, a module without a valid ``ENTRY``."""
    folder = (folder or default_folder()).resolve()
    if not folder.is_dir():
        raise ConfigError("--dir", str(folder), "must be the zoo/ folder (run from the repository's root)")
    names = entry_names(folder)
    for n in only or []:
        if n not in names:
            raise ConfigError("--entry", n, f"must be one of the entries: {', '.join(names)}")
    root = str(folder.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    package = folder.name
    loaded = sys.modules.get(package)
    if loaded is not None and str(folder) not in list(getattr(loaded, "__path__", [])):
        for key in [k for k in sys.modules if k == package or k.startswith(f"{package}.")]:
            del sys.modules[key]  # another folder of the same name was imported before: load this one
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(package, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        if spec is None or spec.loader is None:
            raise ConfigError("--dir", str(folder), "must hold an __init__.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
    out: dict[str, Entry] = {}
    for n in (only or names):
        found = getattr(importlib.import_module(f"{package}.{n}"), "ENTRY", None)
        out[n] = check_entry(n, found)
    return out


def missing(entry: Entry) -> list[str]:
    """The modules of ``entry.requires`` that do not import here."""
    return [m for m in entry.requires if importlib.util.find_spec(m.split(".")[0]) is None]


def only_property(contract: Any, name: str) -> Any:
    """A copy of ``contract`` (a :class:`~distcheck.engine.contracts.contract.Contract` instance) that checks the
    property ``name`` alone: the bug's run, where only that property's verdict counts, is not spent shrinking the
    failures of the others. The copy keeps the contract's name, rank function, cases and checks. Raises
    ConfigError when the contract has no property ``name``."""
    import copy

    kept = tuple(p for p in contract.properties if p.name == name)
    if not kept:
        raise ConfigError("property", name, f"must be a property of the contract {contract.name!r}: "
                          f"{', '.join(p.name for p in contract.properties)}")
    narrowed = copy.copy(contract)
    narrowed.properties = kept
    return narrowed


def run_entry(name: str, entry: Entry, *, seed: int = 0, timeout_s: float = TIMEOUT_S, pool: Any = None) -> ZooRow:
    """Certify ``entry.bug`` and ``entry.fixed`` under ``entry.contract`` at ``entry.world_size`` (gloo).

    ``pool``: a :class:`~distcheck.runners.pool.RankPool` of ``entry.world_size`` ranks to run both on (kept
    open: ``distcheck zoo`` shares one per world size across the entries, which saves each run its world's
    start-up); None: each run opens and closes its own. Raises ConfigError when ``pool`` has another world
    size."""
    if pool is not None and getattr(pool, "world_size", None) != entry.world_size:
        raise ConfigError("pool", f"<world of {getattr(pool, 'world_size', None)} ranks>",
                          f"must have the entry's world_size={entry.world_size} ranks")
    from distcheck.certify import certify, get_contract

    absent = missing(entry)
    if absent:
        return ZooRow(name, entry, skip=f"not installed: {', '.join(absent)} (pip install 'distcheck[libs]')")
    started = time.perf_counter()

    contract = get_contract(entry.contract)
    if not contract.needs_world:
        pool = None  # the contract runs in this process (LocalWorld), whatever the world

    def run(target: Any, under: Any) -> Any:
        where: dict[str, Any] = {"pool": pool} if pool is not None else {"world_sizes": [entry.world_size]}
        return certify(target, under, **where, examples=entry.examples, seed=seed,
                       options=dict(entry.options), timeout_s=timeout_s, dtypes=list(entry.dtypes) or None)

    bug = run(entry.bug, only_property(contract, entry.property))
    failed = [v for v in bug.verdicts if v.property == entry.property and v.verdict == "FAIL"]
    if failed:
        detail = (failed[0].counterexample or failed[0].failure or "").splitlines()[0] if (
            failed[0].counterexample or failed[0].failure) else ""
    else:
        detail = "; ".join(f"{entry.property} {v.verdict} on {v.examples} examples ({v.dtype})"
                           + (f": {v.failure}" if v.failure else "") for v in bug.verdicts)
    fixed = run(entry.fixed, contract)
    if not fixed.ok:
        bad = [f"{v.property} {v.verdict}" for v in fixed.verdicts if v.verdict != "pass"]
        detail += f" | twin: {', '.join(bad) or fixed.verdict}"
    return ZooRow(name, entry, caught=bool(failed), certified=bool(fixed.ok), detail=detail,
                  seconds=time.perf_counter() - started)


def _yes(value: bool | None) -> str:
    return "skip" if value is None else ("yes" if value else "NO")


HEADER = ("entry", "reference", "bug class", "contract", "property", "caught?", "twin certified?")


def _cells(r: ZooRow) -> list[str]:
    e = r.entry
    return [r.name, e.reference, e.bug_class, e.contract, e.property, _yes(r.caught), _yes(r.certified)]


def to_table(rows: list[ZooRow]) -> str:
    """A plain text table, one line per entry, then each entry's detail and a summary line."""
    cells = [list(HEADER), *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        lines.append(f"{r.name}: {r.skip or r.detail} ({r.seconds:.1f} s)")
    ok = sum(r.ok for r in rows)
    lines.append(f"{ok} of {len(rows)} entries caught with their twin certified")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(rows: list[ZooRow]) -> str:
    """The zoo table in markdown (the reference linked)."""
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        c = _cells(r)
        c[1] = f"[{c[1]}]({r.entry.url})"
        out.append("| " + " | ".join(_md(x) for x in c) + " |")
    return "\n".join(out) + "\n"


def metadata_markdown(entries: dict[str, Entry]) -> str:
    """docs/ZOO.md's table, from the metadata alone (nothing run): entry, reference, library and versions,
    bug class, reproduction, contract and property."""
    head = ("entry", "reference", "library (versions)", "bug class", "reproduction", "contract", "property")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, e in entries.items():
        cells = [n, f"[{e.reference}]({e.url})", f"{e.library} ({e.versions})", e.bug_class, e.reproduction,
                 e.contract, e.property]
        out.append("| " + " | ".join(_md(x) for x in cells) + " |")
    return "\n".join(out) + "\n"


def to_json(rows: list[ZooRow]) -> str:
    """The rows as JSON: one object per entry."""
    return json.dumps([{
        "entry": r.name, "reference": r.entry.reference, "url": r.entry.url, "library": r.entry.library,
        "versions": r.entry.versions, "bug_class": r.entry.bug_class, "contract": r.entry.contract,
        "property": r.entry.property, "caught": r.caught, "twin_certified": r.certified, "detail": r.detail,
        "skip": r.skip, "seconds": round(r.seconds, 3),
    } for r in rows], indent=2)
