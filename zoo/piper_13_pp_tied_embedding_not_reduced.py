"""uw-syfi/piper#13: "Tied embedding support" (fix proposed in uw-syfi/piper#25).

piper's pipeline runtime, given a model whose input embedding and output projection share one weight, placed the
two on different pipeline stages as two copies of the weight and never synchronized their gradients before the
optimizer step: each copy trained on its own stage's half of the gradient, and the copies drifted apart silently.
Megatron-LM keeps the same two copies (its shared embedding: the first stage's embedding, the last stage's
head) and sums their gradients over its embedding group, the first and last stage, every step
(``finalize_model_grads``, ``_allreduce_embedding_grads``; NVIDIA/Megatron-LM#299 explains the group).

Re-created in plain torch under pp = 2 on the tiny Llama with a tied head (the contract's ``tied_pp`` option:
distcheck's pipeline split gives each of the two stages its copy): the bug clips with the weight counted once but
never sums the copies' gradients; the twin sums them over the first and last stage in its ``finalize_grads`` hook
(:func:`distcheck.parallel.step.hooks.all_reduce_tied`), as Megatron does."""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget, all_reduce_tied, tied_embedding_clip
from distcheck.zoo import Entry
from zoo._step import parallelize

#: the copies' gradients never summed: each stage steps its copy with its own half of the gradient
BUG = StepTarget(parallelize, clip_grad_norm=tied_embedding_clip)
#: the embedding group's all-reduce before the clipping (Megatron-LM's finalize_model_grads)
FIXED = StepTarget(parallelize, clip_grad_norm=tied_embedding_clip, finalize_grads=all_reduce_tied)

ENTRY = Entry(
    reference="uw-syfi/piper#13",
    url="https://github.com/uw-syfi/piper/issues/13",
    library="piper (pipeline runtime)", versions="main as of July 2026 (the fix, uw-syfi/piper#25, open)",
    bug_class="tied weights under PP: the embedding group's gradient all-reduce missing",
    contract="training-step", property="params",
    bug=BUG, fixed=FIXED,
    summary="the tied embedding and head on the first and last stage are two copies whose gradients are never "
            "summed: the copies drift apart",
    reproduction="plain torch re-creation",
    options={"layout": "pp=2", "tied_pp": True},
)
