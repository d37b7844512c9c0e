"""torch's own composition for distcheck's tiny Llama, the target of the ``step`` rows of ``distcheck
check`` (``distcheck certify distcheck.parallel.step.plans:fsdp2_tp --contract training-step``).

:func:`fsdp2_tp` is torchtitan's ``parallelize_llama`` and ``parallelize_deepseekv3`` reduced to what the tiny
decoder has (torchtitan/models/llama3/infra/parallelize.py and models/deepseek_v3/infra/parallelize.py,
``apply_tp``, ``apply_moe_ep_tp``, ``apply_fsdp``; torchtitan/distributed/expert_parallel.py):

* tensor parallelism with ``parallelize_module`` on the mesh's ``tp`` dimension (sequence-parallel RMSNorms,
  column-parallel ``wq``/``wk``/``wv`` and ``w1``/``w3``, row-parallel ``wo`` and ``w2`` reduce-scattering to
  the sequence shards, a row-parallel embedding and a column-parallel head);
* context parallelism (:func:`apply_cp`): each attention's ``core`` a ring over the mesh's ``cp`` ranks
  (:func:`distcheck.parallel.cp.plans.ring_attention`) on the head-tail chunks the step hands each cp rank;
* the MoE layers' load-balancing loss counted over the ``dp_cp`` ranks (every rank holding different tokens:
  ``aux_group``), and under ep > 1 expert parallelism (:func:`ExpertParallel`, torchtitan's): the experts'
  weights ``Shard(0)`` over the experts' mesh's ``ep`` dim (:func:`~distcheck.parallel.step.hooks.expert_mesh`),
  the routed tokens dispatched to their experts' ranks and back by all-to-alls with variable split sizes (the
  counts exchanged first);
* FSDP2's ``fully_shard`` on the experts over the experts' data-parallel dims (``dp_replicate x efsdp``, their
  gradients divided by ``dp * cp`` as the other parameters' are, :func:`apply_fsdp`), then on every block and on
  the root over ``(dp_replicate, dp_shard_cp)`` (HSDP when both are above 1), with FSDP2's
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` when ``layout.precision`` is
  ``bf16-fsdp`` (:func:`mp_policy`, torchtitan's default mixed precision).

The step clips with :func:`~distcheck.parallel.step.hooks.torch_clip` (``clip_grad_norm_`` on the DTensor
gradients, one norm per mesh under ep). ``examples/my_step.py`` is the same composition written as a user's file,
the worked example of docs/CERTIFY.md.

:data:`TORCH_CONTEXT_PARALLEL` is the same composition with torch's own context parallelism
(``torch.distributed.tensor.experimental.context_parallel`` entered around each micro-batch by the ``accumulate``
hook :func:`torch_context_parallel`, the attention cores left as ``F.scaled_dot_product_attention``); without a
GPU torch 2.13 refuses the CPU attention op on every rank and the contract records its properties ``skip`` with
torch's reason (:func:`distcheck.parallel.cp.plans.cpu_refusal`).

:data:`DDP_STEP` is the plain DDP gradient-accumulation loop (``torch.nn.parallel.DistributedDataParallel`` over
the world, ``model.no_sync()`` before the last micro-batch), a :class:`~distcheck.parallel.step.hooks.StepTarget`
with ``axes=("dp_replicate",)``: ``distcheck certify distcheck.parallel.step.plans:DDP_STEP --contract
training-step --world-sizes 2``.

:data:`TIED_PIPELINE_STEP` is :func:`fsdp2_tp` for a tied head under pipeline parallelism (the contract's
``--option tied_pp=true``): the embedding on the first stage and the head on the last are two copies of one
weight: its ``finalize_grads`` hook (:func:`~distcheck.parallel.step.hooks.all_reduce_tied`) sums their gradients
over the two stages, as Megatron-LM's ``finalize_model_grads`` does over its embedding group, and its
``clip_grad_norm`` hook (:func:`~distcheck.parallel.step.hooks.tied_embedding_clip`) counts the weight once in the
norm: ``distcheck certify
distcheck.parallel.step.plans:TIED_PIPELINE_STEP --contract training-step --option layout=pp=2 --option
tied_pp=true``.

torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fsdp2_tp", "apply_tp", "apply_cp", "apply_moe", "apply_fsdp", "mp_policy", "divide_experts",
           "ExpertParallel", "ddp", "ddp_no_sync", "DDP_STEP", "fsdp2_tp_torch_cp", "torch_context_parallel",
           "TORCH_CONTEXT_PARALLEL", "TIED_PIPELINE_STEP"]


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


def apply_cp(model: Any, cp_mesh: Any, attention: Any = None) -> None:
    """Every block's attention ``core`` replaced by ``attention(q, k, v, group=...)`` over the 1-D ``cp_mesh``'s
    group (default :func:`distcheck.parallel.cp.plans.ring_attention`): the step hands each cp rank its head-tail
    chunks of every sequence and their global positions."""
    import functools

    from distcheck.parallel.cp.plans import ring_attention

    group = cp_mesh.get_group()
    for block in model.layers.values():
        block.attention.core = functools.partial(attention or ring_attention, group=group)


def _expert_parallel_class() -> type:
    """torchtitan's ``ExpertParallel`` (torchtitan/distributed/expert_parallel.py) on the experts module of
    distcheck's MoE (``experts(x_sorted, counts)``): its ``(E, ...)`` weights ``Shard(0)`` over the 1-D ep mesh
    (rank i holds experts i E/ep ..), and around its forward the token dispatch and combine. Dispatch: the
    per-expert counts exchanged first (``all_to_all_single`` of the (E,) counts: each rank learns how many rows
    every rank sends each of its experts), then the rows themselves by a differentiable all-to-all
    (``all_to_all_single_autograd``, torchtitan's) with those split sizes, regrouped by local expert; combine: the
    inverse regrouping and the all-to-all back (split sizes swapped)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    # torchtitan's differentiable all-to-all (torch.distributed.nn.functional's is deprecated in torch 2.13)
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class _ExpertParallel(ParallelStyle):
        def _partition(self, name: str, module: Any, mesh: Any) -> None:
            for pname, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))

        def _dispatch(self, module: Any, inputs: Any, mesh: Any) -> Any:
            x, counts = inputs
            group, ep = mesh.get_group(), mesh.size()
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=group)      # got[j E/ep + i]: rank j's rows for local expert i
            local = got.view(ep, -1)
            send, recv = counts.view(ep, -1).sum(1).tolist(), local.sum(1).tolist()
            x = all_to_all_single_autograd(x, recv, send, group)
            # the rows arrive by source rank, each source's by local expert: regroup by local expert
            sizes = local.reshape(-1)
            starts = torch.cumsum(sizes, 0) - sizes
            n_local = local.shape[1]
            order = [torch.arange(int(starts[j * n_local + i]), int(starts[j * n_local + i]) + int(local[j, i]))
                     for i in range(n_local) for j in range(ep)]
            self.order = torch.cat(order).to(x.device)
            self.splits = (send, recv)
            return x[self.order], local.sum(0)

        def _combine(self, module: Any, out: Any, mesh: Any) -> Any:
            send, recv = self.splits
            back = out[torch.argsort(self.order)]                 # the rows in arrival order again
            return all_to_all_single_autograd(back, send, recv, mesh.get_group())

        def _apply(self, module: Any, mesh: Any) -> Any:
            return distribute_module(module, mesh, partition_fn=self._partition, input_fn=self._dispatch,
                                     output_fn=self._combine)

    return _ExpertParallel


_STYLES: list[type] = []


def ExpertParallel() -> Any:
    """A new torchtitan ``ExpertParallel`` style for ``parallelize_module(experts, ep_mesh, ExpertParallel())``
    (:func:`_expert_parallel_class`)."""
    if not _STYLES:
        _STYLES.append(_expert_parallel_class())
    return _STYLES[0]()


def apply_moe(model: Any, mesh: Any, layout: Any) -> None:
    """The MoE layers' load-balancing loss counted over the mesh's ``dp_cp`` ranks (``aux_group``; None when
    there is one such rank), and under ``layout.ep > 1`` :func:`ExpertParallel` on every ``moe.experts`` over the
    experts' mesh's ``ep`` dim. Nothing for a decoder without MoE layers."""
    from torch.distributed.tensor.parallel import parallelize_module

    from distcheck.parallel.step.hooks import expert_mesh

    blocks = [b for b in model.layers.values() if hasattr(b, "moe")]
    if not blocks:
        return
    group = mesh["dp_cp"].get_group() if layout.dp_cp > 1 else None
    for block in blocks:
        block.moe.aux_group = group
    if layout.ep > 1:
        ep_mesh = expert_mesh(mesh, layout)["ep"]
        for block in blocks:
            parallelize_module(block.moe.experts, ep_mesh, ExpertParallel())


def divide_experts(output: Any, factor: int) -> None:
    """The experts' FSDP2 reduce hook (``set_all_reduce_hook``): ``output`` (their reduced gradient shard) divided
    in place by ``factor`` (ep: see :func:`apply_fsdp`)."""
    output.div_(factor)


def mp_policy(layout: Any) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``layout.precision``: ``param_dtype=torch.bfloat16,
    reduce_dtype=torch.float32`` under ``bf16-fsdp`` (torchtitan's default mixed precision), none otherwise
    (:mod:`distcheck.parallel.step.precision`)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if layout.precision == "bf16-fsdp":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: Any, dp_mesh: Any, experts_mesh: Any = None, ep: int = 1, *, mp: Any = None) -> None:
    """FSDP2's ``fully_shard`` on every transformer block, then on the root (torchtitan's ``apply_fsdp``), over
    ``dp_mesh``, with the mixed-precision policy ``mp`` (default: none; :func:`mp_policy`); with ``experts_mesh``
    (the experts' data-parallel dims, ``dp_replicate x efsdp``) every ``moe.experts`` first over it. FSDP2 averages
    the experts' gradients over their ``dp * cp / ep`` data-parallel ranks, but every rank's tokens reach them
    through the all-to-all: like every other gradient they must be divided by ``dp * cp``
    (pytorch/torchtitan#1551), so a reduce hook divides them by ``ep`` more. torchtitan calls
    ``set_gradient_divide_factor(dp * cp)`` instead; torch 2.13's FSDP2 divides twice by such a factor on a
    one-rank shard group (efsdp = 1) in float64 and float16 (its pre-division, then the one-rank copy divided by the
    whole factor: a gradient 1/f^2 of the sum), which the hook avoids."""
    import functools

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp or MixedPrecisionPolicy()
    for block in model.layers.values():
        if experts_mesh is not None and hasattr(block, "moe"):
            fully_shard(block.moe.experts, mesh=experts_mesh, mp_policy=mp)
            if ep > 1:
                block.moe.experts.set_all_reduce_hook(functools.partial(divide_experts, factor=ep))
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def fsdp2_tp(model: Any, mesh: Any, layout: Any) -> Any:
    """``parallelize(model, mesh, layout) -> model`` (module doc): :func:`apply_tp` on ``mesh["tp"]`` when
    ``layout.tp > 1`` (the tied head tied again: ``parallelize_module`` gives it its own DTensor), :func:`apply_cp`
    on ``mesh["cp"]`` when ``layout.cp > 1``, :func:`apply_moe`, then :func:`apply_fsdp` on ``mesh["dp_replicate",
    "dp_shard_cp"]`` (the experts first on the experts' mesh under ep > 1) with :func:`mp_policy` of the layout."""
    from distcheck.parallel.step.hooks import expert_mesh

    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied and layout.pp == 1:  # under pp the two stages hold a copy each
            model.output.weight = model.tok_embeddings.weight
    if layout.cp > 1:
        apply_cp(model, mesh["cp"])
    apply_moe(model, mesh, layout)
    experts = expert_mesh(mesh, layout)["dp_replicate", "efsdp"] if layout.ep > 1 else None
    apply_fsdp(model, mesh["dp_replicate", "dp_shard_cp"], experts, layout.ep, mp=mp_policy(layout))
    return model


def fsdp2_tp_torch_cp(model: Any, mesh: Any, layout: Any) -> Any:
    """:func:`fsdp2_tp` with every attention core left as it is (``F.scaled_dot_product_attention``): torch's
    ``context_parallel`` (:func:`torch_context_parallel`, the ``accumulate`` hook) replaces it by its ring."""
    from distcheck.parallel.step.hooks import expert_mesh

    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied and layout.pp == 1:  # under pp the two stages hold a copy each
            model.output.weight = model.tok_embeddings.weight
    apply_moe(model, mesh, layout)
    experts = expert_mesh(mesh, layout)["dp_replicate", "efsdp"] if layout.ep > 1 else None
    apply_fsdp(model, mesh["dp_replicate", "dp_shard_cp"], experts, layout.ep, mp=mp_policy(layout))
    return model


def torch_context_parallel(model: Any, info: Any) -> Any:
    """The ``accumulate`` hook of :data:`TORCH_CONTEXT_PARALLEL`: under cp > 1 torch's
    ``torch.distributed.tensor.experimental.context_parallel`` on ``info.mesh["cp"]`` around the micro-batch's
    forward and backward (it replaces ``F.scaled_dot_product_attention`` by its ring over the cp ranks, its
    load balancer's head-tail layout being the chunks the step hands each rank; a throwaway buffer of the whole
    sequence's length sizes it, as :func:`distcheck.parallel.cp.plans.torch_context_parallel` does);
    ``contextlib.nullcontext()`` at cp = 1. Without a GPU torch 2.13 refuses the CPU attention op
    (:data:`distcheck.parallel.cp.plans.CPU_REFUSAL`): the contract records the target's properties ``skip``."""
    import contextlib

    import torch
    from torch.distributed.tensor.experimental import context_parallel

    if info.layout.cp == 1 or info.positions is None:
        return contextlib.nullcontext()
    whole = torch.empty(1, 1, info.positions.numel() * info.layout.cp, device=info.positions.device)
    return context_parallel(info.mesh["cp"], buffers=[whole], buffer_seq_dims=[2], no_restore_buffers={whole})


def _torch_cp_step() -> Any:
    from distcheck.parallel.step.hooks import StepTarget

    return StepTarget(fsdp2_tp_torch_cp, accumulate=torch_context_parallel,
                      axes=("dp_replicate", "dp_shard", "tp", "cp", "ep"))


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


def _tied_pipeline_step() -> Any:
    from distcheck.parallel.step.hooks import StepTarget, all_reduce_tied, tied_embedding_clip

    return StepTarget(fsdp2_tp, clip_grad_norm=tied_embedding_clip, finalize_grads=all_reduce_tied)


#: torch's composition with a tied head under pp (the contract's ``tied_pp`` option): the two copies' gradients
#: summed over the first and last stage (Megatron-LM's embedding group, module doc)
TIED_PIPELINE_STEP = _tied_pipeline_step()

#: the plain DDP gradient-accumulation loop (module doc)
DDP_STEP = _ddp_step()

#: torch's composition with torch's own context parallelism (``context_parallel``) instead of distcheck's ring: a
#: skip with torch's reason without a GPU (module doc)
TORCH_CONTEXT_PARALLEL = _torch_cp_step()
