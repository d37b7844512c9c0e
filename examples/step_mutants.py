"""Training steps that get the composition wrong, one per public bug class, as ``training-step`` targets.
Each is torch's composition of ``examples/my_step.py`` with one hook or one line changed; each fails the
property named, with a shrunk counterexample naming the composition::

    distcheck certify examples.step_mutants:LOCAL_SHARD_NORM --contract training-step --world-sizes 2

============================  ==========================================================  ==================
target                        mistake (public report)                                     fails
============================  ==========================================================  ==================
LOCAL_SHARD_NORM              the grad norm of the local FSDP / tp shard only             grad_norm
                              (pytorch/pytorch#170862)
TP_REPLICATED_TP_TIMES        local squares summed over dp_shard and tp: a tp-replicated  grad_norm
                              parameter counted tp times (meta-pytorch/torchtune#2420)
MEAN_OF_MEANS                 each micro-batch's mean loss, averaged over the             params
                              micro-batches (the 2024 transformers accumulation bug)
WORLD_SIZE_SCALE              gradients scaled by the world size, not the dp size         grad_norm
                              (meta-pytorch/torchtune#2420)
NORM_GRADS_NOT_SUMMED         sequence-parallel norms whose weight gradients are never    params
                              summed across tp (norms left off the plan)
LOSS_OF_OWN_SHARD             the reported loss is each rank's own shard's (rank 0's is   loss
                              the one logged)
TOKENS_OVER_WORLD             tokens all-reduced over the whole world: tp replicas        tokens
                              counted tp times
CLIP_WITHOUT_CLAMP            max_norm / norm applied even when it exceeds 1              clipping
STAGE_LOCAL_NORM              torch's clip_grad_norm_ on a pipeline stage: the norm of    grad_norm
                              that stage's gradients only (pytorch/torchtitan#596)
NO_SYNC_EVERY_MICRO_BATCH     DDP's no_sync() left on for the last micro-batch too: the   params, loss,
                              gradients are never all-reduced (each replica steps alone)  grad_norm, clipping
AUX_LOSS_PER_RANK             the MoE load-balancing loss of each rank's own tokens,      params, grad_norm
                              averaged over the ranks, not the global micro-batch's
                              (arXiv:2501.11873, "Demons in the Detail")
ROUTER_NOT_REDUCED_OVER_EP    the router sharded with the experts: its gradient reduced   params, loss,
                              over the experts' data-parallel ranks only, not over ep     grad_norm
EXPERT_GRADS_OVER_EXPERT_DP   expert gradients averaged over the experts' own data-       params, grad_norm
                              parallel degree dp cp / ep, not dp cp: ep times too large
                              (pytorch/torchtitan#1551)
CP_LOSS_MEAN_OF_CHUNKS        each cp rank's chunk mean, averaged over the cp ranks: the  params, grad_norm
                              head-tail chunks keep unequal tokens
LOCAL_POSITIONS               RoPE positions 0 .. s/cp - 1 on every cp rank, not its      params, loss
                              chunks' global positions
============================  ==========================================================  ==================

Bugs inside the model rather than in the loop (each fails ``params``; the first divergence of the failure's
recorded replay names the module that holds the bug, :mod:`distcheck.parallel.step.trace`)::

    distcheck certify examples.step_mutants:ROW_PARALLEL_NOT_REDUCED --contract training-step --world-sizes 2

========================  ==========================================================  ===========================
target                    mistake                                                     first divergence
========================  ==========================================================  ===========================
ROW_PARALLEL_NOT_REDUCED  Megatron-style plain tensors (examples/my_megatron_step.py)  output of
                          with layers.0.feed_forward.w2's partial outputs never       layers.0.feed_forward.w2
                          all-reduced over tp
SP_NORM_NOT_SUMMED        torch's plan with layers.0.ffn_norm a hand-written          reduced grad of
                          sequence-parallel RMSNorm whose weight gradient is never    layers.0.ffn_norm.weight
                          summed over tp
TIE_LOST                  a tied head split by the tensor-parallel plan                grad of tok_embeddings.weight
                          (parallelize_module gives output.weight a DTensor of its    (tied to output.weight)
                          own) and never tied again
========================  ==========================================================  ===========================
"""

from __future__ import annotations

import functools

from distcheck.parallel.step.hooks import StepTarget, all_reduce_dp
from distcheck.parallel.step.model import moe_layers, token_loss_sum
from distcheck.parallel.step.plans import ddp
from examples.my_megatron_step import SequenceParallelRMSNorm, megatron_clip, shard_dims
from examples.my_megatron_step import apply_tp as megatron_tp
from examples.my_step import apply_fsdp, apply_tp, parallelize


def _local_squares(parameters):
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    return grads, sum((torch.sum(g * g) for g in local), torch.zeros((), dtype=torch.float64))


def _clip(grads, total, max_norm):
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    for g in grads:
        g.mul_(coef)
    return total


def local_shard_norm(parameters, max_norm, info):
    """The norm of this rank's local shards, never reduced."""
    grads, sq = _local_squares(parameters)
    return _clip(grads, sq.sqrt(), max_norm)


def tp_replicated_tp_times(parameters, max_norm, info):
    """Local squares all-reduced over dp_shard and tp: right for the shards, tp times for a replicated norm."""
    import torch.distributed as dist

    grads, sq = _local_squares(parameters)
    for name in ("dp_shard", "tp"):
        if info.mesh[name].size() > 1:
            dist.all_reduce(sq, group=info.mesh.get_group(name))
    return _clip(grads, sq.sqrt(), max_norm)


def mean_of_means(logits, labels, info):
    """The micro-batch's token mean, divided by the number of micro-batches (FSDP2 averages over dp)."""
    return token_loss_sum(logits, labels) / info.microbatch_tokens / info.num_microbatches


def world_size_scale(logits, labels, info):
    """The global token-mean loss scaled by the world size instead of the dp size."""
    return token_loss_sum(logits, labels) * info.layout.world_size / info.global_tokens


def loss_of_own_shard(loss_sum, tokens, info):
    """The loss of this rank's own micro-batches (the tokens still all-reduced)."""
    _, seen = all_reduce_dp(loss_sum, tokens, info)
    return loss_sum / tokens, seen


def tokens_over_world(loss_sum, tokens, info):
    """Loss and tokens all-reduced over every rank, tp and dp alike."""
    import torch
    import torch.distributed as dist

    both = torch.stack([loss_sum.detach(), tokens.detach()])
    dist.all_reduce(both)
    return both[0] / both[1], both[1]


def clip_without_clamp(parameters, max_norm, info):
    """torch's total norm, then every gradient multiplied by max_norm / (norm + 1e-6), even above 1."""
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    coef = max_norm / (total + 1e-6)
    for g in grads:
        g.mul_(coef)
    return total


def full_norm(parameters, max_norm, info):
    """The norm of every gradient's full tensor (works when the parameters live on different meshes); under pp
    the stages' squares summed over the pp group."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in parameters if p.grad is not None]
    sq = torch.tensor(sum(float(torch.sum((g.full_tensor() if hasattr(g, "full_tensor") else g) ** 2))
                          for g in grads), dtype=torch.float64)
    if info.layout.pp > 1:
        dist.all_reduce(sq, group=info.mesh.get_group("pp"))
    return _clip(grads, float(sq) ** 0.5, max_norm)


def stage_local_norm(parameters, max_norm, info):
    """``torch.nn.utils.clip_grad_norm_`` as it is, on every layout: under pp > 1 it sees one stage's gradients."""
    import torch

    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)


def parallelize_norms_off_plan(model, mesh, layout):
    """torch's composition with every RMSNorm left off the tensor-parallel plan: each runs on its rank's
    sequence shard with a local weight, whose gradient is never summed across tp."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], norms=False)
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"])
    return model


LOCAL_SHARD_NORM = StepTarget(parallelize, clip_grad_norm=local_shard_norm)
TP_REPLICATED_TP_TIMES = StepTarget(parallelize, clip_grad_norm=tp_replicated_tp_times)
MEAN_OF_MEANS = StepTarget(parallelize, loss_fn=mean_of_means)
WORLD_SIZE_SCALE = StepTarget(parallelize, loss_fn=world_size_scale)
NORM_GRADS_NOT_SUMMED = StepTarget(parallelize_norms_off_plan, clip_grad_norm=full_norm)
LOSS_OF_OWN_SHARD = StepTarget(parallelize, report_loss=loss_of_own_shard)
TOKENS_OVER_WORLD = StepTarget(parallelize, report_loss=tokens_over_world)
CLIP_WITHOUT_CLAMP = StepTarget(parallelize, clip_grad_norm=clip_without_clamp)
STAGE_LOCAL_NORM = StepTarget(parallelize, clip_grad_norm=stage_local_norm)


def no_sync_every_micro_batch(model, info):
    """``model.no_sync()`` around every micro-batch, the last one too."""
    return model.no_sync()


NO_SYNC_EVERY_MICRO_BATCH = StepTarget(ddp, accumulate=no_sync_every_micro_batch, axes=("dp_replicate",))


def aux_loss_per_rank(logits, labels, info):
    """The token-mean loss as the default, and each MoE layer's load-balancing loss ``E sum_e f_e P_e`` of this
    rank's own tokens (its ``routing``), weighted as one rank's: FSDP2's average makes it the mean over the ranks of
    their own losses."""
    import torch

    main = token_loss_sum(logits, labels) * info.layout.dp_cp / info.global_tokens
    for moe in moe_layers(info.model):
        probs, chosen = moe.routing
        f = torch.bincount(chosen.reshape(-1), minlength=moe.n_experts).to(probs.dtype) / chosen.numel()
        main = main + moe.aux_weight * moe.n_experts * torch.sum(f * probs.mean(dim=0)) / info.num_microbatches
    return main


def cp_loss_mean_of_chunks(logits, labels, info):
    """Each cp rank's mean over its chunks' kept tokens, times the micro-batch's kept tokens (summed over cp): the
    micro-batch's loss is the mean of the cp ranks' chunk means."""
    import torch
    import torch.distributed as dist

    mine = info.microbatch_tokens
    seq = torch.tensor(float(mine), dtype=torch.float64)
    if info.layout.cp > 1:
        dist.all_reduce(seq, group=info.mesh.get_group("cp"))
    return token_loss_sum(logits, labels) / max(mine, 1) * float(seq) * info.layout.dp / info.global_tokens


def local_positions(tokens, labels, info):
    """The forward's inputs with positions 0 .. s_local - 1: each chunk's own indices, not its global ones."""
    import torch

    if info.positions is None:
        return tokens
    return {"tokens": tokens, "positions": torch.arange(tokens.shape[1], device=tokens.device)}


_NO_PP = ("dp_replicate", "dp_shard", "tp", "cp", "ep")
AUX_LOSS_PER_RANK = StepTarget(parallelize, loss_fn=aux_loss_per_rank)
ROUTER_NOT_REDUCED_OVER_EP = StepTarget(functools.partial(parallelize, router_with_experts=True))
EXPERT_GRADS_OVER_EXPERT_DP = StepTarget(functools.partial(parallelize, divide_experts=False))
CP_LOSS_MEAN_OF_CHUNKS = StepTarget(parallelize, loss_fn=cp_loss_mean_of_chunks)
LOCAL_POSITIONS = StepTarget(parallelize, batch=local_positions, axes=_NO_PP)

def parallelize_row_not_reduced(model, mesh, layout):
    """Megatron-style tensor parallelism with plain tensors, ``layers.0.feed_forward.w2`` never all-reducing its
    partial outputs; DDP over dp_replicate."""
    import torch

    if layout.tp > 1:
        megatron_tp(model, mesh.get_group("tp"), unreduced=("layers.0.feed_forward.w2",))
    if layout.dp_replicate > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, process_group=mesh.get_group("dp_replicate"))
    return model


def parallelize_sp_norm_not_summed(model, mesh, layout):
    """torch's composition with ``layers.0.ffn_norm`` replaced, after the plan, by a hand-written
    sequence-parallel RMSNorm whose weight gradient is never summed over tp."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        block = model.layers["0"]
        block.ffn_norm = SequenceParallelRMSNorm(block.ffn_norm, mesh.get_group("tp"), sum_weight_grad=False)
        if model.config.tied:
            model.output.weight = model.tok_embeddings.weight
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"])
    return model


def parallelize_tie_lost(model, mesh, layout):
    """torch's composition without the head tied again after the tensor-parallel plan."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"])
    return model


ROW_PARALLEL_NOT_REDUCED = StepTarget(parallelize_row_not_reduced, clip_grad_norm=megatron_clip,
                                      axes=("dp_replicate", "tp"), shard_dims=shard_dims)
SP_NORM_NOT_SUMMED = StepTarget(parallelize_sp_norm_not_summed, clip_grad_norm=full_norm)
TIE_LOST = StepTarget(parallelize_tie_lost)
