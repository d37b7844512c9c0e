"""Recorded upstream discrepancies (findings), found by discovery, and how they label a check's row.

A finding is a discrepancy in an upstream library that distcheck reproduces and
records: the check it belongs to, its EXACT symptom (a regular expression that
must match the row's whole detail, written so that it matches only that
discrepancy's message), the library versions it was seen on, and how anyone can
reproduce it. :func:`label_findings` applies the records to a list of rows:

- a ``FAIL`` row whose check has a record and whose detail matches the symptom
  exactly becomes ``finding``;
- a ``FAIL`` row of that check with any other detail (a crash, a timeout, a
  deadlock, ``RankFailure``, ``WorldTimeout``, a different mismatch) stays
  ``FAIL``; ``extra["finding_differs"]`` names the record it does not match;
- a ``pass`` row of that check stays ``pass``, and its detail starts with
  "recorded finding NAME no longer reproduces on torch VERSION": upstream fixed
  it, and the record should be retired. ``extra["finding_no_longer_reproduces"]``
  names it and :func:`distcheck.report.summary_line` lists it;
- rows of other checks, and ``skip`` rows, are left alone.

A target that cannot be loaded (its module does not import) is never a finding, which is
reserved for an exact, recorded discrepancy in code that ran. Such a row is made by
:func:`not_loaded`: a ``skip`` naming the import error and what to install (``FAIL`` when the
caller requires it: a module its installed libraries should provide), marked
``extra["not_loaded"]``; :func:`label_findings` never labels it, nor any ``FAIL`` whose detail is
an import error (``ImportError``, ``ModuleNotFoundError``). :class:`Finding` refuses a symptom
that describes one.

Labelling is idempotent (a row already labelled is not labelled again).

Records live with the check they explain: a parallelism package's ``findings`` role module
(``distcheck/parallel/<name>/findings.py``) defines ``FINDINGS``, a tuple of :class:`Finding`,
collected by :func:`known_findings` (:mod:`distcheck.engine.discovery`; no list to edit).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace

from distcheck.core.results import FAIL, FINDING, PASS, SKIP, CheckResult

__all__ = ["Finding", "known_findings", "label_findings", "library_versions", "not_loaded", "is_import_failure"]

#: the exception names of a module that cannot be imported (a target not loaded, never a finding)
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")
_IMPORT_FAILURE = re.compile(r"\b(?:" + "|".join(IMPORT_ERRORS) + r")\b|\bcannot\\? (?:be\\? )?import")


def is_import_failure(text: str) -> bool:
    """True if ``text`` (a row's detail, or a symptom pattern) reports a module that cannot be imported:
    it names ``ImportError`` or ``ModuleNotFoundError``, or says "cannot import" / "cannot be imported" (also
    as :func:`re.escape` writes them, spaces escaped)."""
    return _IMPORT_FAILURE.search(text or "") is not None


@dataclass(frozen=True)
class Finding:
    """A recorded upstream discrepancy.

    Attributes:
        name: a short stable id, e.g. ``"torch.Schedule1F1B.table_last_rank"``.
        check: the one check whose FAIL it explains (exact match of the row's ``check``).
        symptom: a regular expression that must match the FAIL row's WHOLE detail
            (:func:`re.fullmatch`), precise enough to match only this discrepancy.
        summary: one line: what is wrong upstream, with the smallest case.
        library: the upstream distribution, e.g. ``"torch"``.
        seen_on: the versions of ``library`` it was reproduced on.
        reproduce: a command anyone can run with the project's files to see it. A finding of a check
            that runs on a world writes the world as ``{world_size}`` and ``{backend}``: each labelled
            row's ``reproduce`` names its own (:meth:`reproduce_for`).
        reported: where it is recorded or reported upstream (a reference, not a guess).
    """

    name: str
    check: str
    symptom: str
    summary: str
    library: str
    seen_on: tuple[str, ...]
    reproduce: str
    reported: str

    def __post_init__(self) -> None:
        from distcheck.core.errors import ConfigError

        if is_import_failure(self.symptom):
            raise ConfigError(f"{self.name}.symptom", self.symptom,
                              "describes a module that cannot be imported: that is a target not loaded, a skip "
                              "naming what to install (distcheck.engine.findings.not_loaded), never a finding")

    def reproduce_for(self, row: CheckResult) -> str:
        """:attr:`reproduce` for ``row``: ``{world_size}`` and ``{backend}`` replaced by the row's."""
        return self.reproduce.replace("{world_size}", str(row.world_size)).replace("{backend}", row.backend)

    def matches(self, row: CheckResult) -> bool:
        """True if ``row`` is a FAIL of this finding's check with exactly its symptom."""
        return row.check == self.check and row.verdict == FAIL and \
            re.fullmatch(self.symptom, row.detail or "") is not None


def not_loaded(check: str, backend: str, module: str, exc: BaseException, install: str, *,
               required: bool = False, extra: Mapping | None = None) -> CheckResult:
    """The row of a target whose module ``module`` cannot be imported (``exc``, the import error).

    A ``skip`` (``FAIL`` when ``required``) whose detail names the module, the error and ``install``
    (the command or source that provides it); ``extra["not_loaded"]`` holds the three, so that
    :func:`label_findings` never turns it into a finding."""
    detail = (f"not loaded: cannot import {module} ({type(exc).__name__}: {exc}); "
              f"to certify it, install {install}")
    info = {"module": module, "error": f"{type(exc).__name__}: {exc}", "install": install}
    return CheckResult(check=check, backend=backend, verdict=FAIL if required else SKIP, detail=detail,
                       extra={**(extra or {}), "not_loaded": info})


def known_findings() -> tuple[Finding, ...]:
    """Every package's recorded findings (the ``FINDINGS`` of its ``findings`` role module), in package order.

    Raises ConfigError when a findings module has no ``FINDINGS`` tuple of :class:`Finding`."""
    from distcheck.core.errors import ConfigError
    from distcheck.engine.discovery import role_modules

    out: list[Finding] = []
    for module in role_modules("findings"):
        records = getattr(module, "FINDINGS", None)
        if not isinstance(records, tuple) or not all(isinstance(f, Finding) for f in records):
            raise ConfigError(f"{module.__name__}.FINDINGS", records,
                              "must be a tuple of distcheck.engine.findings.Finding")
        out += records
    return tuple(out)


def library_versions(findings: Iterable[Finding] | None = None) -> dict[str, str]:
    """The installed version of every library ``findings`` (default :func:`known_findings`) name
    (``"not installed"`` when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for lib in sorted({f.library for f in (known_findings() if findings is None else findings)}):
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = "not installed"
    return out


_LABELLED = ("finding", "finding_differs", "finding_no_longer_reproduces")


def label_findings(rows: Iterable[CheckResult], findings: Iterable[Finding] | None = None, *,
                   versions: Mapping[str, str] | None = None) -> list[CheckResult]:
    """Apply the recorded findings to ``rows`` (see the module docstring); return new rows.

    Args:
        rows: check results, in any order.
        findings: the records (default :func:`known_findings`); at most one per check.
        versions: library -> installed version, for the details (default :func:`library_versions`
            of the records, looked up only when a row needs it).

    Raises ValueError if two records name the same check.
    """
    records = tuple(known_findings() if findings is None else findings)
    by_check: dict[str, Finding] = {}
    for record in records:
        if record.check in by_check:
            raise ValueError(f"two findings record check {record.check!r}: "
                             f"{by_check[record.check].name}, {record.name}")
        by_check[record.check] = record
    out = []
    for row in rows:
        f = by_check.get(row.check)
        if f is None or any(key in row.extra for key in _LABELLED) or row.verdict not in (PASS, FAIL) \
                or "not_loaded" in row.extra or (row.verdict == FAIL and is_import_failure(row.detail)):
            out.append(row)  # a target that did not load is a skip (or a FAIL when required), never a finding
            continue
        if versions is None:
            versions = library_versions(records)
        here = f"{f.library} {versions.get(f.library, 'unknown')}"
        seen = f"{f.library} {', '.join(f.seen_on)}"
        if f.matches(row):
            row = replace(row, verdict=FINDING,
                          detail=f"recorded finding {f.name} (seen on {seen}; here {here}): {f.summary}. "
                                 f"Observed: {row.detail}",
                          extra=dict(row.extra, finding=dict(asdict(f), reproduce=f.reproduce_for(row))))
        elif row.verdict == FAIL:
            row = replace(row, detail=f"{row.detail} [not the recorded finding {f.name}: its symptom differs]",
                          extra=dict(row.extra, finding_differs=f.name))
        else:
            row = replace(row, detail=f"recorded finding {f.name} no longer reproduces on {here} "
                                      f"(seen on {seen}); {row.detail}",
                          extra=dict(row.extra, finding_no_longer_reproduces=f.name))
        out.append(row)
    return out
