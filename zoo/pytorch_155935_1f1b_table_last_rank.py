"""pytorch/pytorch#155935: "Add get_pipeline_order() for Gpipe and 1F1B" (the table torch's ``Schedule1F1B``
has carried since; recorded as a finding in distcheck/parallel/pp/findings.py, not found in torch's tracker).

The schedule visualizer and ``_PipelineScheduleRuntime`` read a schedule's ``pipeline_order``. On the last rank,
which has no warm-up forward, ``Schedule1F1B``'s table increments the micro-batch index before the first forward:
it starts at micro-batch 1 and names micro-batch m, which does not exist (smallest case p = 1, m = 1:
``[0F1, 0B0]``), while the order torch executes is right. Runs torch's own code: torch 2.13's ``Schedule1F1B``
table under the pipeline-table contract; the twin is a 1F1B table whose last rank starts at micro-batch 0
(examples/my_pipeline_schedules.py)."""

from __future__ import annotations

from distcheck.zoo import Entry

ENTRY = Entry(
    reference="pytorch/pytorch#155935",
    url="https://github.com/pytorch/pytorch/pull/155935",
    library="torch (torch.distributed.pipelining)", versions="seen on 2.11.0 and 2.13.0 (the table added June 2025)",
    bug_class="pipeline schedule: the action table names a micro-batch that does not exist",
    contract="pipeline-table", property="dependencies",
    bug="torch.distributed.pipelining:Schedule1F1B", fixed="examples.my_pipeline_schedules:one_f_one_b",
    summary="Schedule1F1B's table on the last rank starts at micro-batch 1 and names micro-batch m",
    reproduction="library code",
    options={"schedule": "1f1b"},
)
