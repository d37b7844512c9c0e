"""Known discrepancies in upstream libraries that distcheck's checks reproduce.

A check that FAILs because of a documented upstream bug is re-labelled
``finding`` (see :data:`distcheck.report.FINDING`) only when the failure's
detail matches the recorded symptom; an unrecorded failure stays a FAIL, and a
fixed bug simply makes the check pass. Each record says what was seen, on which
torch version, and the smallest case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from distcheck.report import FAIL, FINDING, CheckResult

__all__ = ["Finding", "KNOWN_FINDINGS", "label_findings"]


@dataclass(frozen=True)
class Finding:
    """A recorded upstream discrepancy.

    Attributes:
        check: the check name whose FAIL it explains (exact match).
        symptom: a regular expression the FAIL row's detail must match.
        summary: one line saying what is wrong upstream, with the smallest case.
        seen_on: the torch version it was first reproduced on.
    """

    check: str
    symptom: str
    summary: str
    seen_on: str


KNOWN_FINDINGS: tuple[Finding, ...] = (
    Finding(
        check="pp.table.Schedule1F1B",
        symptom=r"p=1, m=1|out of range|microbatch",
        summary=("torch's Schedule1F1B pipeline_order is wrong on the last rank (starts at micro-batch 1 and "
                 "names micro-batch m, which does not exist; smallest case p=1, m=1: [0F1, 0B0]); what torch "
                 "executes is right (pp.executed_timeline.Schedule1F1B passes)"),
        seen_on="2.11 (CUDA) and 2.13 (CPU)",
    ),
    Finding(
        check="pp.executed_order.Schedule1F1B",
        symptom=r".",
        summary="torch executes a different order than its own Schedule1F1B table lists (see pp.table.Schedule1F1B)",
        seen_on="2.11 (CUDA) and 2.13 (CPU)",
    ),
)


def label_findings(rows: list[CheckResult]) -> list[CheckResult]:
    """Return ``rows`` with FAILs that match a :data:`KNOWN_FINDINGS` record re-labelled ``finding``."""
    by_check = {f.check: f for f in KNOWN_FINDINGS}
    out = []
    for row in rows:
        f = by_check.get(row.check)
        if row.verdict == FAIL and f is not None and re.search(f.symptom, row.detail or ""):
            row = replace(row, verdict=FINDING, detail=f"known torch finding: {f.summary}. Observed: {row.detail}")
        out.append(row)
    return out
