"""Golden figures: answer keys (golden/*.toml) whose every verdict is pinned by ``expect``.

A golden key is an answer key (docs/AUDIT.md) with three extra rules: every claim
and every ``[[check]]`` has ``expect``, every claim has ``section`` (provenance
inside the ``[meta] source`` document), and ``[meta] source`` names the document.
:func:`verify` audits a key and compares each verdict with its ``expect``: the
value is recomputed by the library every time, and the stored ``claimed`` figure
is only what the recomputation is checked against.

The keys live in the repository's ``golden/`` folder, their one copy. A built wheel
ships that folder inside the package as ``distcheck/golden_keys`` (a setuptools
``package-dir`` mapping in ``pyproject.toml``), so an installed distcheck finds its
keys without a checkout: :func:`default_golden_dir`. A shipped key can be named by
its file stem (``chapter``): :func:`shipped_keys`, :func:`resolve_key`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from distcheck.audit.files import as_path
from distcheck.audit.keys import UNDECIDED, AnswerKey, load_key
from distcheck.audit.verdict import audit_key
from distcheck.core.errors import AnswerKeyError, GoldenError
from distcheck.report import FAIL, PASS, SKIP, CheckResult

__all__ = ["default_golden_dir", "golden_paths", "shipped_keys", "resolve_key", "load_golden", "verify",
           "verify_all"]


def default_golden_dir() -> Path:
    """The folder of the golden keys shipped with distcheck.

    An installed wheel holds them as package data, ``<site-packages>/distcheck/golden_keys``
    (read through :mod:`importlib.resources`). A source checkout run in place (an editable
    install, or ``PYTHONPATH=.``) has no such folder and uses the checkout's ``golden/``.
    """
    shipped = resources.files("distcheck") / "golden_keys"
    if isinstance(shipped, Path) and shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parent.parent / "golden"


def golden_paths(directory: str | Path | None = None) -> list[Path]:
    """The golden keys in ``directory`` (default :func:`default_golden_dir`), sorted.

    Raises GoldenError when the folder does not exist or holds no ``*.toml``, ConfigError
    when ``directory`` is not a path.
    """
    d = as_path("directory", directory) if directory is not None else default_golden_dir()
    if not d.is_dir():
        raise GoldenError(f"golden folder {d} does not exist")
    paths = sorted(d.glob("*.toml"))
    if not paths:
        raise GoldenError(f"golden folder {d} holds no *.toml key")
    return paths


def shipped_keys() -> dict[str, Path]:
    """The shipped golden keys by name (file stem), sorted: ``{"chapter": .../chapter.toml, ...}``.

    Raises GoldenError when the shipped folder is missing or empty.
    """
    return {p.stem: p for p in golden_paths()}


def resolve_key(key: str | Path) -> Path:
    """The answer key a user names on the command line.

    An existing file, or anything with a folder or a suffix (``golden/chapter.toml``,
    ``my.toml``), is a path and is returned as given: reading it reports what is wrong
    with it. A bare name that is no file here (``chapter``) names a shipped key.
    Raises AnswerKeyError for a bare name that is neither, listing the shipped names.
    """
    p = Path(key)
    if p.exists() or len(p.parts) != 1 or p.suffix:
        return p
    shipped = shipped_keys()
    if p.name in shipped:
        return shipped[p.name]
    raise AnswerKeyError(f"no such file, and no shipped key of that name (shipped: {', '.join(shipped)}; "
                         "see `distcheck audit --list-keys`)", path=str(key))


def load_golden(path: str | Path) -> AnswerKey:
    """Load an answer key and enforce the golden rules (expect and section on every claim,
    expect on every check). Raises AnswerKeyError naming the file, line and field, ConfigError
    when ``path`` is not a path."""
    key = load_key(path)
    for c in key.claims:
        if c.expect is None:
            raise AnswerKeyError("a golden claim needs expect", path=key.path, line=c.line,
                                 field=f"claim[{c.index}] ({c.id}).expect")
        if not c.section.strip():
            raise AnswerKeyError("a golden claim needs section (provenance)", path=key.path, line=c.line,
                                 field=f"claim[{c.index}] ({c.id}).section")
    for k in key.checks:
        if k.expect is None:
            raise AnswerKeyError("a golden check needs expect", path=key.path, line=k.line,
                                 field=f"check ({k.id}).expect")
    return key


def _name(path: Path, ident: str) -> str:
    """A row's check name: the claim id, prefixed ``<key>:`` unless the id already starts with it
    (``chapter.70b.weights`` from chapter.toml; ``zero.pos`` from tampered.toml -> ``tampered:zero.pos``)."""
    return ident if ident.startswith(path.stem + ".") else f"{path.stem}:{ident}"


def _detail(verdict: str, expect: str, ok: bool, explanation: str) -> str:
    """``"as recorded, wrong: ..."`` when the audit reproduces the golden verdict, else says both."""
    head = f"as recorded, {verdict}" if ok else f"audit says {verdict}, golden records {expect}"
    return f"{head}: {explanation}"


def _undecided_row(p: Path, v: Any, expect: str, ok: bool) -> CheckResult:
    """The strict row of an undecided claim (ambiguous or not-checkable: nothing says whether its figure
    is right). It is a skip, never a pass, when the key records that verdict with a reason (its ``note``);
    it FAILs when the key expects another verdict, or records it without a reason."""
    reason = v.claim.note.strip()
    if ok and reason:
        verdict, detail = SKIP, f"undecided, recorded as {v.verdict} with its reason: {reason}; audit: {v.explanation}"
    elif ok:
        verdict, detail = FAIL, (f"undecided ({v.verdict}) without a reason: a golden records an undecided claim "
                                 f"only with a note saying why; audit: {v.explanation}")
    else:
        verdict, detail = FAIL, _detail(v.verdict, expect, ok, v.explanation)
    return CheckResult(check=_name(p, v.claim.id), backend="golden", verdict=verdict,
                       examples=0 if verdict == SKIP else 1, detail=detail,
                       extra={"quantity": v.claim.quantity, "section": v.claim.section})


def verify(path: str | Path) -> list[CheckResult]:
    """Audit the golden key at ``path``: one CheckResult (backend "golden") per claim and per
    consistency check, "pass" when the verdict equals ``expect``. The check is strict: an undecided
    claim (ambiguous, not-checkable) is a skip naming its recorded reason when ``expect`` records that
    verdict and the claim has a ``note``, and FAILs otherwise (never a pass). An automatic consistency
    finding (same quantity and inputs) must be "consistent". A malformed key gives one FAIL row;
    a ``path`` that is not a path raises ConfigError."""
    p = as_path("path", path)
    try:
        key = load_golden(p)
        result = audit_key(key)
    except AnswerKeyError as exc:
        return [CheckResult(check=f"golden/{p.name}", backend="golden", verdict=FAIL, examples=0,
                            detail=str(exc).splitlines()[0])]
    rows: list[CheckResult] = []
    for v in result.claims:
        expect = v.claim.expect or ""  # load_golden gives every claim an expect
        ok = v.verdict == expect
        err = v.error
        if v.verdict in UNDECIDED:
            rows.append(_undecided_row(p, v, expect, ok))
            continue
        rows.append(CheckResult(
            check=_name(p, v.claim.id), backend="golden", verdict=PASS if ok else FAIL, examples=1,
            # the error column is distcheck's error against a figure that holds; for a figure
            # recorded as wrong, its own discrepancy is in the detail, not an error of the check
            max_error=err if v.claim.expect == "holds" else None,
            bound=float(v.claim.step / 2) if (err is not None and v.claim.expect == "holds") else None,
            detail=_detail(v.verdict, expect, ok, v.explanation),
            extra={"quantity": v.claim.quantity, "section": v.claim.section},
        ))
    for k in result.checks:
        expect = (k.expect or "") if not k.automatic else "consistent"  # load_golden gives every check one
        ok = k.verdict == expect
        rows.append(CheckResult(
            check=_name(p, k.id), backend="golden", verdict=PASS if ok else FAIL, examples=1,
            detail=_detail(k.verdict, expect, ok, k.explanation),
        ))
    return rows


def verify_all(directory: str | Path | None = None) -> list[CheckResult]:
    """:func:`verify` every golden key of ``directory`` (default: the shipped golden/)."""
    rows: list[CheckResult] = []
    for path in golden_paths(directory):
        rows.extend(verify(path))
    return rows
