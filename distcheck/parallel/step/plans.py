"""torch's own composition for distcheck's tiny Llama, the target of the ``step`` rows of ``distcheck
check`` (``distcheck certify distcheck.parallel.step.plans:fsdp2_tp --contract training-step``).

:func:`fsdp2_tp` is torchtitan's ``parallelize_llama`` reduced to what the tiny decoder has
(torchtitan/models/llama3/infra/parallelize.py, ``apply_tp`` and ``apply_fsdp``): tensor parallelism with
``parallelize_module`` on the mesh's ``tp`` dimension (sequence-parallel RMSNorms, column-parallel
``wq``/``wk``/``wv`` and ``w1``/``w3``, row-parallel ``wo`` and ``w2`` reduce-scattering to the sequence
shards, a row-parallel embedding and a column-parallel head), then FSDP2's ``fully_shard`` on every block
and on the root over the ``(dp_replicate, dp_shard)`` sub-mesh (HSDP when both are above 1). The step clips
with ``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients (the contract's default hook).
``examples/my_step.py`` is the same composition written as a user's file, the worked example of
docs/CERTIFY.md.

:data:`DDP_STEP` is the plain DDP gradient-accumulation loop (``torch.nn.parallel.DistributedDataParallel`` over
the world, ``model.no_sync()`` before the last micro-batch), a :class:`~distcheck.parallel.step.hooks.StepTarget`
with ``axes=("dp_replicate",)``: ``distcheck certify distcheck.parallel.step.plans:DDP_STEP --contract
training-step --world-sizes 2``.

torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fsdp2_tp", "apply_tp", "apply_fsdp", "mp_policy", "ddp", "ddp_no_sync", "DDP_STEP"]


def apply_tp(model: Any, tp_mesh: Any) -> None:
    """torchtitan's Llama tensor-parallel plan on ``model`` (a :class:`~distcheck.parallel.step.model` decoder,
    or a pipeline stage of one: the embedding, final norm and head only where the stage holds them), over the
    1-D ``tp_mesh``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    top = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }  # a pipeline stage lacks the embedding or the final norm and head: the plan names what it holds
    parallelize_module(model, tp_mesh, {k: v for k, v in top.items() if getattr(model, k) is not None})
    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(), "attention": gathered,
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(), "feed_forward": gathered,
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def mp_policy(layout: Any) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``layout.precision``: ``param_dtype=torch.bfloat16,
    reduce_dtype=torch.float32`` under ``bf16-fsdp`` (torchtitan's default mixed precision), none otherwise
    (:mod:`distcheck.parallel.step.precision`)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if layout.precision == "bf16-fsdp":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: Any, dp_mesh: Any, mp: Any = None) -> None:
    """FSDP2's ``fully_shard`` on every transformer block, then on the root (torchtitan's ``apply_fsdp``), with
    the mixed-precision policy ``mp`` (default: none)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp or MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def fsdp2_tp(model: Any, mesh: Any, layout: Any) -> Any:
    """``parallelize(model, mesh, layout) -> model``: :func:`apply_tp` on ``mesh["tp"]`` when ``layout.tp > 1``
    (the tied head tied again: ``parallelize_module`` gives it its own DTensor), then :func:`apply_fsdp` on
    ``mesh["dp_replicate", "dp_shard"]`` with :func:`mp_policy` of the layout."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied:
            model.output.weight = model.tok_embeddings.weight
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"], mp_policy(layout))
    return model


def ddp(model: Any, mesh: Any, layout: Any) -> Any:
    """``parallelize(model, mesh, layout) -> model``: ``DistributedDataParallel(model)`` over the mesh's
    ``dp_replicate`` group. RuntimeError for a layout with another axis above 1."""
    from torch.nn.parallel import DistributedDataParallel

    if layout.world_size != layout.dp_replicate:
        raise RuntimeError(f"DDP replicates over the whole world: layout {layout} is not dp_replicate only")
    return DistributedDataParallel(model, process_group=mesh.get_group("dp_replicate"))


def ddp_no_sync(model: Any, info: Any) -> Any:
    """The ``accumulate`` hook of a DDP loop: ``model.no_sync()`` on every micro-batch but the last (DDP's
    all-reduce then runs once per step, on the accumulated gradients), ``contextlib.nullcontext()`` on the last."""
    import contextlib

    return model.no_sync() if info.microbatch < info.num_microbatches - 1 else contextlib.nullcontext()


def _ddp_step() -> Any:
    from distcheck.core.vocab import Axis
    from distcheck.parallel.step.hooks import StepTarget

    return StepTarget(ddp, accumulate=ddp_no_sync, axes=(Axis.DP_REPLICATE.value,))


#: the plain DDP gradient-accumulation loop (module doc)
DDP_STEP = _ddp_step()
