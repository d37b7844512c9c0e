"""``training-step`` targets of the first-divergence tests: Megatron-style plain tensor parallelism
(examples/my_megatron_step.py) whose row-parallel layers leave their partial sums to the module above them (each
block's attention and MLP all-reduce their outputs in a forward hook), with one bug: layers.0's MLP never
reduces. ``DECLARED`` says that ``wo`` and ``w2`` output partial sums (``shard_dims``: ``"sum"``);
``UNDECLARED`` does not, so their outputs look like every rank's own and the first divergence falls on them."""

from __future__ import annotations

from distcheck.parallel.step import StepTarget
from examples.my_megatron_step import _ReduceFromTp, apply_tp, megatron_clip, shard_dims


def _reduce_output(group):
    def hook(module, args, output):
        return _ReduceFromTp.apply(output, group)

    return hook


def parallelize(model, mesh, layout):
    if layout.tp > 1:
        group = mesh.get_group("tp")
        apply_tp(model, group, unreduced=tuple(f"layers.{i}.{m}" for i in model.layers
                                               for m in ("attention.wo", "feed_forward.w2")))
        for i, block in model.layers.items():
            block.attention.register_forward_hook(_reduce_output(group))
            if i != "0":  # the bug: layers.0's MLP output is never reduced
                block.feed_forward.register_forward_hook(_reduce_output(group))
    return model


def partial_sums(name):
    if name.endswith(("attention.wo", "feed_forward.w2")):
        return "sum"
    return shard_dims(name)


DECLARED = StepTarget(parallelize, clip_grad_norm=megatron_clip, axes=("tp",), shard_dims=partial_sums)
UNDECLARED = StepTarget(parallelize, clip_grad_norm=megatron_clip, axes=("tp",), shard_dims=shard_dims)
