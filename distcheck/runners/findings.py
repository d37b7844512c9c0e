"""The recorded findings of the checks that have not moved into their parallelism package yet
(pipelining), and the labelling of ``distcheck check``'s rows with every recorded finding.

Transitional. The machinery (:class:`Finding`, :func:`label_findings`) is
:mod:`distcheck.engine.findings`, and a package's records live in its ``findings`` role module
(``FINDINGS``), found by discovery. The records below belong to ``runners/pipelining.py`` and
move with it into ``distcheck/parallel/pp/findings.py``; then :data:`KNOWN_FINDINGS` is
:func:`~distcheck.engine.findings.known_findings` alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from distcheck.engine.findings import Finding, known_findings
from distcheck.engine.findings import label_findings as _label
from distcheck.report import CheckResult

__all__ = ["KNOWN_FINDINGS", "NOT_YET_MOVED", "Finding", "label_findings", "library_versions"]

_1F1B_SUMMARY = ("torch's Schedule1F1B table (_get_pipeline_order) is wrong on the last rank: with no warm-up "
                 "forward there, the steady phase increments the micro-batch index before its first forward, so "
                 "the table starts at micro-batch 1 and names micro-batch m, which does not exist (smallest case "
                 "p=1, m=1: [0F1, 0B0]); the order torch executes is right (pp.executed_timeline.Schedule1F1B "
                 "passes)")
_1F1B_REPORTED = ("not found in pytorch/pytorch's issue tracker; the table comes from Schedule1F1B._get_pipeline_order, "
                  "added by pytorch/pytorch pull request 155935 ('Add get_pipeline_order() for Gpipe and 1F1B'); "
                  "recorded in docs/LAYERS.md, section Pipelining")

_SCHEDULE_1F1B: tuple[Finding, ...] = (
    Finding(
        name="torch.Schedule1F1B.table_last_rank",
        check="pp.table.Schedule1F1B",
        # the scan reports its smallest case (p=1, m=1); `distcheck plan pipeline --torch` reports the
        # case it was asked for. Either way the last rank's first forward names micro-batch m, which
        # does not exist (mb = num_microbatches = m), on its own stage
        symptom=(r"(?:smallest disagreement: )?p=[1-9]\d*, m=(?P<m>[1-9]\d*): torch's table does not replay: "
                 r"microbatch=(?P=m) must be < num_microbatches=(?P=m) "
                 r"\(in F\(mb=(?P=m), stage=(?P<s>\d+)\) on rank (?P=s)\)"),
        summary=_1F1B_SUMMARY,
        library="torch",
        seen_on=("2.11.0+cu130", "2.13.0+cpu"),
        reproduce=("python -c \"from torch.distributed.pipelining import Schedule1F1B; "
                   "from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops; "
                   "print(get_schedule_ops(Schedule1F1B, 1, 1))\"   # [[0F1, 0B0, ...]]: micro-batch 1 of 1; "
                   "or: distcheck check --only layers --world-sizes 2"),
        reported=_1F1B_REPORTED,
    ),
    Finding(
        name="torch.Schedule1F1B.executed_vs_table",
        check="pp.executed_order.Schedule1F1B",
        # the same defect seen from a real world: the last rank executes F0, B0, F1 ... while its
        # table lists F1, B0, F2 ... (stage index = rank, first difference at position 0)
        symptom=(r"p=[1-9]\d*, m=[1-9]\d*, rank (?P<r>\d+): first difference at position 0: "
                 r"executed \[\('F', (?P=r), 0\), \('B', (?P=r), 0\), \('F', (?P=r), 1\)\] "
                 r"vs table \[\('F', (?P=r), 1\), \('B', (?P=r), 0\), \('F', (?P=r), 2\)\]"),
        summary=("what torch executes on the last rank (F0, B0, F1, ...) differs from its own Schedule1F1B table "
                 "(F1, B0, F2, ...): the table is wrong, see torch.Schedule1F1B.table_last_rank"),
        library="torch",
        seen_on=("2.11.0+cu130", "2.13.0+cpu"),
        reproduce="distcheck check --only layers --world-sizes 2",
        reported=_1F1B_REPORTED,
    ),
)

#: the records of checks that have not moved into their package yet (pipelining's)
NOT_YET_MOVED: tuple[Finding, ...] = _SCHEDULE_1F1B

#: every recorded finding: the packages' (discovered), then those not moved yet
KNOWN_FINDINGS: tuple[Finding, ...] = known_findings() + NOT_YET_MOVED


def library_versions() -> dict[str, str]:
    """The installed version of every library a finding names (``"not installed"`` when absent)."""
    from distcheck.engine.findings import library_versions as versions

    return versions(KNOWN_FINDINGS)


def label_findings(rows: Iterable[CheckResult], findings: Iterable[Finding] | None = None, *,
                   versions: Mapping[str, str] | None = None) -> list[CheckResult]:
    """:func:`distcheck.engine.findings.label_findings` with :data:`KNOWN_FINDINGS` by default."""
    return _label(rows, KNOWN_FINDINGS if findings is None else findings, versions=versions)
