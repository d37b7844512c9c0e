"""pytorch/torchtitan#1733: "Gradient accumulation broken in PP" (fixed by pytorch/torchtitan#1732).

torch's pipelining schedules take ``scale_grads=True`` by default: after the backward of every step they divide
every gradient by the number of micro-batches. torchtitan built its schedules with that default while its loss was
already normalized (and accumulated over several schedule steps), so the gradients were divided again at every
step: much smaller than without PP, with loss and grad-norm curves that diverge. Runs torch's own code: torch's
``ScheduleGPipe`` with ``scale_grads=True`` (examples/my_torch_schedules.py) where the caller's loss is a sum that
needs no scaling; the twin is torch's ``ScheduleGPipe`` built with ``scale_grads=False``, as the contract (and
torchtitan after the fix) builds it."""

from __future__ import annotations

from distcheck.zoo import Entry

ENTRY = Entry(
    reference="pytorch/torchtitan#1733",
    url="https://github.com/pytorch/torchtitan/issues/1733",
    library="torchtitan on torch.distributed.pipelining",
    versions="torchtitan main with torch 2.10.0.dev20250915 (as reported)",
    bug_class="pipeline schedule: gradients scaled by the schedule on top of the loss's own normalization",
    contract="pipeline-schedule", property="gradients",
    bug="examples.my_torch_schedules:GPipeMeanLoss", fixed="torch.distributed.pipelining:ScheduleGPipe",
    summary="the schedule divides every gradient by the micro-batches though the loss is already normalized",
    reproduction="library code",
    options={"schedule": "gpipe"},
)
