"""Recorded upstream discrepancies (findings) and how they label a check's row.

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

Labelling is idempotent (a row already labelled is not labelled again).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace

from distcheck.report import FAIL, FINDING, PASS, CheckResult

__all__ = ["KNOWN_FINDINGS", "Finding", "label_findings", "library_versions"]


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
        reproduce: a command anyone can run with the project's files to see it.
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

    def matches(self, row: CheckResult) -> bool:
        """True if ``row`` is a FAIL of this finding's check with exactly its symptom."""
        return row.check == self.check and row.verdict == FAIL and \
            re.fullmatch(self.symptom, row.detail or "") is not None


_1F1B_SUMMARY = ("torch's Schedule1F1B table (_get_pipeline_order) is wrong on the last rank: with no warm-up "
                 "forward there, the steady phase increments the micro-batch index before its first forward, so "
                 "the table starts at micro-batch 1 and names micro-batch m, which does not exist (smallest case "
                 "p=1, m=1: [0F1, 0B0]); the order torch executes is right (pp.executed_timeline.Schedule1F1B "
                 "passes)")
_1F1B_REPORTED = ("not found in pytorch/pytorch's issue tracker; the table comes from Schedule1F1B._get_pipeline_order, "
                  "added by pytorch/pytorch pull request 155935 ('Add get_pipeline_order() for Gpipe and 1F1B'); "
                  "recorded in docs/LAYERS.md, section Pipelining")

KNOWN_FINDINGS: tuple[Finding, ...] = (
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


def library_versions() -> dict[str, str]:
    """The installed version of every library a finding names (``"not installed"`` when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for lib in sorted({f.library for f in KNOWN_FINDINGS}):
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
        findings: the records (default :data:`KNOWN_FINDINGS`); at most one per check.
        versions: library -> installed version, for the details (default :func:`library_versions`,
            looked up only when a row needs it).

    Raises ValueError if two records name the same check.
    """
    records = tuple(KNOWN_FINDINGS if findings is None else findings)
    by_check: dict[str, Finding] = {}
    for record in records:
        if record.check in by_check:
            raise ValueError(f"two findings record check {record.check!r}: {by_check[record.check].name}, {record.name}")
        by_check[record.check] = record
    out = []
    for row in rows:
        f = by_check.get(row.check)
        if f is None or any(key in row.extra for key in _LABELLED) or row.verdict not in (PASS, FAIL):
            out.append(row)
            continue
        if versions is None:
            versions = library_versions()
        here = f"{f.library} {versions.get(f.library, 'unknown')}"
        seen = f"{f.library} {', '.join(f.seen_on)}"
        if f.matches(row):
            row = replace(row, verdict=FINDING,
                          detail=f"recorded finding {f.name} (seen on {seen}; here {here}): {f.summary}. "
                                 f"Observed: {row.detail}",
                          extra=dict(row.extra, finding=asdict(f)))
        elif row.verdict == FAIL:
            row = replace(row, detail=f"{row.detail} [not the recorded finding {f.name}: its symptom differs]",
                          extra=dict(row.extra, finding_differs=f.name))
        else:
            row = replace(row, detail=f"recorded finding {f.name} no longer reproduces on {here} "
                                      f"(seen on {seen}); {row.detail}",
                          extra=dict(row.extra, finding_no_longer_reproduces=f.name))
        out.append(row)
    return out
