"""Hand-written Megatron-style tensor parallelism with plain tensors (no DTensor) for distcheck's tiny Llama, as a
``training-step`` target: each block's ``wq``/``wk``/``wv`` and ``w1``/``w3`` become :class:`ColumnParallelLinear`
(this rank's rows of the weight; the input's gradient all-reduced over tp), ``wo`` and ``w2``
:class:`RowParallelLinear` (this rank's columns; the partial outputs all-reduced), the embedding, norms and head
stay replicated; DDP over the ``dp_replicate`` group; the grad norm is Megatron's (the squares of tp-sharded
gradients summed over tp, a replicated one counted once)::

    distcheck certify examples.my_megatron_step:STEP --contract training-step --world-sizes 2,4

The step's parameters are plain local shards, which distcheck maps back to full tensors over tp: ``shard_dims``
says which dim each is split on (the shapes would say the same here). :class:`SequenceParallelRMSNorm` is a
sequence-parallel norm written the same way (the local sequence shard, a replicated weight whose gradient is
summed over tp), used by ``examples/step_mutants.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcheck.parallel.step import StepTarget


class _CopyToTp(torch.autograd.Function):
    """Megatron's ``f``: identity forward, the gradient all-reduced over tp backward (every rank used it all)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's ``g``: the partial sums all-reduced over tp forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _shard(weight, group, dim):
    return nn.Parameter(weight.detach().chunk(dist.get_world_size(group), dim)[dist.get_rank(group)].clone())


class ColumnParallelLinear(nn.Module):
    """``linear``'s output rows split over tp (weight dim 0); the output stays split along its last dim."""

    def __init__(self, linear, group):
        super().__init__()
        self.group, self.weight = group, _shard(linear.weight, group, 0)
        self.weight.tensor_model_parallel = True  # Megatron's mark: not a duplicate of another tp rank's

    def forward(self, x):
        return F.linear(_CopyToTp.apply(x, self.group), self.weight)


class RowParallelLinear(nn.Module):
    """``linear``'s input columns split over tp (weight dim 1); the partial outputs all-reduced unless
    ``reduce=False`` (``examples/step_mutants.py``)."""

    def __init__(self, linear, group, *, reduce=True):
        super().__init__()
        self.group, self.reduce, self.weight = group, reduce, _shard(linear.weight, group, 1)
        self.weight.tensor_model_parallel = True

    def forward(self, x):
        y = F.linear(x, self.weight)
        return _ReduceFromTp.apply(y, self.group) if self.reduce else y


class SequenceParallelRMSNorm(nn.Module):
    """``norm`` (an ``nn.RMSNorm``) on this rank's sequence shard, its weight replicated: each rank's weight
    gradient is a partial sum over its tokens, summed over tp in the backward (``sum_weight_grad=False``
    leaves it unsummed: ``examples/step_mutants.py``)."""

    def __init__(self, norm, group, *, sum_weight_grad=True):
        super().__init__()
        self.group, self.sum_weight_grad, self.eps = group, sum_weight_grad, norm.eps
        weight = norm.weight.detach()  # a DTensor when a tensor-parallel plan placed the norm: its full tensor
        self.weight = nn.Parameter((weight.full_tensor() if hasattr(weight, "full_tensor") else weight).clone())

    def forward(self, x):
        w = _CopyToTp.apply(self.weight, self.group) if self.sum_weight_grad else self.weight
        return F.rms_norm(x, self.weight.shape, w, self.eps)


def apply_tp(model, group, *, unreduced=()):
    """Each block's projections replaced by their tp shards; the row-parallel layers named in ``unreduced``
    (``"layers.0.feed_forward.w2"``) leave their partial outputs unreduced (``examples/step_mutants.py``)."""
    for i, block in model.layers.items():
        a, f = block.attention, block.feed_forward
        a.wq, a.wk, a.wv = (ColumnParallelLinear(m, group) for m in (a.wq, a.wk, a.wv))
        f.w1, f.w3 = ColumnParallelLinear(f.w1, group), ColumnParallelLinear(f.w3, group)
        a.wo = RowParallelLinear(a.wo, group, reduce=f"layers.{i}.attention.wo" not in unreduced)
        f.w2 = RowParallelLinear(f.w2, group, reduce=f"layers.{i}.feed_forward.w2" not in unreduced)


def parallelize(model, mesh, layout):
    """``parallelize(model, mesh, layout) -> model``: :func:`apply_tp` on the tp group, then DDP over
    ``dp_replicate``."""
    if layout.tp > 1:
        apply_tp(model, mesh.get_group("tp"))
    if layout.dp_replicate > 1:
        model = nn.parallel.DistributedDataParallel(model, process_group=mesh.get_group("dp_replicate"))
    return model


def megatron_clip(parameters, max_norm, info):
    """Megatron's ``clip_grad_norm``: the squares of the gradients of tp-sharded parameters, and of the
    replicated ones on tp rank 0 only, all-reduced over tp; every gradient scaled by ``min(1, max_norm /
    (norm + 1e-6))``. Returns the norm."""
    params = [p for p in parameters if p.grad is not None]
    tp = info.mesh.get_group("tp")
    first = dist.get_rank(tp) == 0
    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        if getattr(p, "tensor_model_parallel", False) or first:
            sq += torch.sum(p.grad.double() ** 2)
    dist.all_reduce(sq, group=tp)
    norm = sq.sqrt()
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    for p in params:
        p.grad.mul_(coef)
    return norm


def shard_dims(name):
    """The dim each plain parameter is split on over tp: column-parallel weights on 0, row-parallel on 1."""
    if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight")):
        return 0
    if name.endswith(("wo.weight", "w2.weight")):
        return 1
    return None


STEP = StepTarget(parallelize, clip_grad_norm=megatron_clip, axes=("dp_replicate", "tp"), shard_dims=shard_dims)
