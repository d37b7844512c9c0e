"""The labelling of ``distcheck check``'s rows with every recorded upstream finding (public path).

The machinery (:class:`Finding`, :func:`label_findings`) is :mod:`distcheck.engine.findings`;
each package's records live in its ``findings`` role module (``FINDINGS``), found by discovery
(e.g. :mod:`distcheck.parallel.pp.findings`, torch's ``Schedule1F1B`` table). A target that cannot be
imported is :func:`not_loaded`'s skip, never a finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from distcheck.engine.findings import Finding, known_findings
from distcheck.engine.findings import label_findings as _label
from distcheck.report import CheckResult

__all__ = ["KNOWN_FINDINGS", "label_findings", "library_versions"]

#: every recorded finding of the parallelism packages (discovered)
KNOWN_FINDINGS: tuple[Finding, ...] = known_findings()


def library_versions() -> dict[str, str]:
    """The installed version of every library a finding names (``"not installed"`` when absent)."""
    from distcheck.engine.findings import library_versions as versions

    return versions(KNOWN_FINDINGS)


def label_findings(rows: Iterable[CheckResult], findings: Iterable[Finding] | None = None, *,
                   versions: Mapping[str, str] | None = None) -> list[CheckResult]:
    """:func:`distcheck.engine.findings.label_findings` with :data:`KNOWN_FINDINGS` by default."""
    return _label(rows, KNOWN_FINDINGS if findings is None else findings, versions=versions)
