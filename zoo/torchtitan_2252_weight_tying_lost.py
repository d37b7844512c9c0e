"""pytorch/torchtitan#2252: "Weight tying not working" (fixed by pytorch/torchtitan#2253).

torchtitan's Qwen3 ``parallelize`` tied ``model.output.weight`` to ``model.tok_embeddings.weight`` while the model
was still on the meta device; materialization then gave the two modules separate tensors, so the head and the
embedding trained as two parameters, each with its own gradient and AdamW state, silently. Re-created in plain
torch under tp = 2: torchtitan's tensor-parallel plan on the tied tiny Llama gives ``output.weight`` a DTensor of
its own (in the report, the separate materialization does), and nothing ties it again
(examples/step_mutants.py, TIE_LOST); the twin ties the head again after the plan (examples/my_step.py)."""

from __future__ import annotations

from distcheck.zoo import Entry
from examples.step_mutants import TIE_LOST
from zoo._step import FIXED

ENTRY = Entry(
    reference="pytorch/torchtitan#2252",
    url="https://github.com/pytorch/torchtitan/issues/2252",
    library="torchtitan (Qwen3, weight tying)", versions="main at 09c6d74 (January 2026)",
    bug_class="tied weights under TP: the tie lost by parallelize",
    contract="training-step", property="params",
    bug=TIE_LOST, fixed=FIXED,
    summary="the head tied to the embedding before parallelize becomes a parameter of its own: two copies drift",
    reproduction="plain torch re-creation",
    options={"layout": "tp=2"},
)
