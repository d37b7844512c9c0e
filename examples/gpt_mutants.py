"""The GPT-2-style decoder of ``examples/my_gpt.py`` under parallelize functions that get its plan wrong, as
``training-step`` targets; each fails ``params`` on a tensor-parallel layout::

    distcheck certify examples.gpt_mutants:TIED_HEAD_NOT_RETIED --contract training-step --world-sizes 2

======================  ==============================================================================  ======
target                  mistake                                                                         fails
======================  ==============================================================================  ======
TIED_HEAD_NOT_RETIED    the head and the embedding left as the two DTensors ``parallelize_module``       params
                        made of the tied weight: each steps on its own half of the gradient
LAYERNORM_OFF_PLAN      the LayerNorms left off the plan under sequence parallelism: each rank's        params
                        weight and bias gradients come from its own sequence shard, never summed
======================  ==============================================================================  ======

``LAYERNORM_OFF_PLAN`` clips with the norm of every gradient's full tensor (``examples.step_mutants.full_norm``):
its LayerNorm parameters live on the dp mesh only, the others on the dp x tp mesh, and torch's
``clip_grad_norm_`` does not take gradients from two meshes.
"""

from __future__ import annotations

from distcheck.parallel.step import StepTarget
from examples.my_gpt import CONFIG, GPT, apply_fsdp, apply_tp
from examples.step_mutants import full_norm


def parallelize_untied(model, mesh, layout):
    """examples/my_gpt.py's plan without tying the head to the embedding again."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], retie=False)
    return apply_fsdp(model, mesh["dp_replicate", "dp_shard"])


def parallelize_norms_off_plan(model, mesh, layout):
    """examples/my_gpt.py's plan with every LayerNorm left off it."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], norms=False)
    return apply_fsdp(model, mesh["dp_replicate", "dp_shard"])


TIED_HEAD_NOT_RETIED = StepTarget(parallelize_untied, model=GPT, config=CONFIG)
LAYERNORM_OFF_PLAN = StepTarget(parallelize_norms_off_plan, model=GPT, config=CONFIG, clip_grad_norm=full_norm)
