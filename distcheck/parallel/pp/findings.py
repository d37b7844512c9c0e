"""Recorded upstream discrepancies of the pipelining checks (:mod:`distcheck.parallel.pp.checks`).

Each record is a :class:`distcheck.engine.findings.Finding`: the one check it explains, its
exact symptom (a regular expression that must match the FAIL row's whole detail), what is
wrong upstream with the smallest case, the torch versions it was seen on, a command that
reproduces it, and where it is recorded. :func:`distcheck.engine.findings.label_findings`
applies them.
"""

from __future__ import annotations

from distcheck.engine.findings import Finding

__all__ = ["FINDINGS"]

_1F1B_SUMMARY = ("torch's Schedule1F1B table (_get_pipeline_order) is wrong on the last rank: with no warm-up "
                 "forward there, the steady phase increments the micro-batch index before its first forward, so "
                 "the table starts at micro-batch 1 and names micro-batch m, which does not exist (smallest case "
                 "p=1, m=1: [0F1, 0B0]); the order torch executes is right (pp.executed_timeline.Schedule1F1B "
                 "passes)")
_1F1B_REPORTED = ("not found in pytorch/pytorch's issue tracker; the table comes from "
                  "Schedule1F1B._get_pipeline_order, added by pytorch/pytorch pull request 155935 "
                  "('Add get_pipeline_order() for Gpipe and 1F1B'); "
                  "recorded in docs/LAYERS.md, section Pipelining")

FINDINGS: tuple[Finding, ...] = (
    Finding(
        name="torch.Schedule1F1B.table_last_rank",
        check="pp.table.Schedule1F1B",
        # the scan reports its smallest case (p=1, m=1); `distcheck plan pp --torch` reports the
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
                   "or: distcheck plan pp --p 1 --m 1 --torch Schedule1F1B"),
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
        reproduce="distcheck check --only layers --world-sizes {world_size} --backend {backend}",
        reported=_1F1B_REPORTED,
    ),
)
