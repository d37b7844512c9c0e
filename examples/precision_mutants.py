"""Training steps whose bugs exist only in low precision, as ``training-step`` targets: each is torch's composition
of ``examples/my_step.py`` with one thing kept in bf16 that bf16 mixed precision keeps in fp32 (torchtitan's
``mixed_precision_param = "bfloat16"``, ``mixed_precision_reduce = "float32"``). Under ``--dtypes bfloat16`` each
fails, its shrunk case naming the precision (``StepCase(dp_replicate=1, dp_shard=2, tp=1, pp=1, m=1, clip binds,
precision=bf16-fsdp; ...``); in float64 they fail too, trivially (a bf16 rounding is far above float64's bound)::

    distcheck certify examples.precision_mutants:BF16_GRAD_REDUCE --contract training-step --dtypes bfloat16

===================  ======================================================================  ================
target               mistake                                                                 fails
===================  ======================================================================  ================
BF16_MASTER_WEIGHTS  the model cast to bf16 before FSDP2: master weights, their gradients'     params
                     accumulation and AdamW's ``exp_avg`` / ``exp_avg_sq`` all in bf16
BF16_GRAD_REDUCE     ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``: the gradients      params
                     reduce-scattered (and all-reduced over replicas) in bf16 where the
                     policy of bf16 mixed precision asks for fp32
BF16_LOSS_SUM        the logged loss kept in a bf16 running sum over the micro-batches         loss
                     (``total += loss.detach().to(torch.bfloat16)``), then reduced over dp
===================  ======================================================================  ================

Each shows on a composition that keeps every micro-batch's arithmetic (dp_shard or dp_replicate, tp = 1), where the
parallel step is held to the single-device bf16 step within fp32 reordering (``distcheck.parallel.step.precision``):
one bf16 rounding of a sum, 2^-9 of it, is 2^7 above that floor. Under tensor parallelism a bf16 rounding is the
noise the single device itself carries, so there these bugs are within the bound, as the contract's doc says.
"""

from __future__ import annotations

from distcheck.parallel.step.hooks import StepTarget, cross_entropy_sum, dp_groups
from examples.my_step import apply_fsdp, apply_tp, parallelize


def parallelize_bf16_master(model, mesh, layout):
    """examples/my_step.py's plan on the model cast to bf16 first: FSDP2's sharded parameters (the master weights
    AdamW steps), their gradients and AdamW's state are bf16."""
    import torch

    return parallelize(model.to(torch.bfloat16), mesh, layout)


def bf16_reduce_policy(layout):
    """The policy with ``reduce_dtype=torch.bfloat16`` (and bf16 compute under ``bf16-fsdp``; under autocast the
    compute is autocast's and only the reduction is bf16)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = torch.bfloat16 if layout.precision == "bf16-fsdp" else None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.bfloat16)


def parallelize_bf16_reduce(model, mesh, layout):
    """examples/my_step.py's plan with the gradients reduced in bf16."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied:
            model.output.weight = model.tok_embeddings.weight
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"], mp=bf16_reduce_policy(layout))
    return model


#: this rank's running sum of the micro-batches' losses, in bf16 (one process per rank: module state is per rank)
_RUNNING: dict = {}


def loss_fn_bf16_running_sum(logits, labels, info):
    """The default loss to backpropagate (the micro-batch's summed loss x dp / the step's tokens); on the side, the
    summed loss added to this rank's bf16 running sum (a new sum at the step's first micro-batch)."""
    import torch

    value = (info.token_loss or cross_entropy_sum)(logits, labels, info)
    running = value.detach().to(torch.bfloat16)
    _RUNNING["sum"] = running if info.microbatch == 0 else _RUNNING["sum"] + running
    return value * info.layout.dp / info.global_tokens


def report_bf16_running_sum(loss_sum, tokens, info):
    """The bf16 running sum reported instead of the step's exact one, summed over the dp ranks (float64)."""
    import torch
    import torch.distributed as dist

    both = torch.stack([_RUNNING.pop("sum").to(torch.float64), tokens.detach()])
    for group in dp_groups(info.mesh):
        dist.all_reduce(both, group=group)
    return both[0] / both[1], both[1]


BF16_MASTER_WEIGHTS = StepTarget(parallelize_bf16_master)
BF16_GRAD_REDUCE = StepTarget(parallelize_bf16_reduce)
# the running sum lives in the micro-batch loop, which a pipeline schedule replaces: pp is left out
BF16_LOSS_SUM = StepTarget(parallelize, loss_fn=loss_fn_bf16_running_sum, report_loss=report_bf16_running_sum,
                           axes=("dp_replicate", "dp_shard", "tp"))
