"""torch's own composition for distcheck's tiny Llama, as a torchtitan-style parallelize function:
tensor parallelism with ``parallelize_module`` (torchtitan's Llama plan: sequence-parallel norms,
column-parallel q/k/v and w1/w3, row-parallel wo and w2, a row-parallel embedding and a column-parallel
head) on the mesh's ``tp`` dimension; context parallelism (each attention's core a ring over the mesh's ``cp``
ranks: distcheck's, ``distcheck.parallel.cp.plans.ring_attention``, or this folder's own,
``examples/my_ring_attention.py``, in :func:`parallelize_own_ring`); the MoE layers' load-balancing loss counted
over every rank holding different tokens and, under ep > 1, torchtitan's ``ExpertParallel`` on the experts over
the experts' mesh (``distcheck.parallel.step.expert_mesh``: ep borrowed from dp_shard x cp, torchtitan's
placement, or from dp x cp, Megatron's); then FSDP2's ``fully_shard`` on the experts over their data-parallel
dims, on every block and the root over the ``(dp_replicate, dp_shard_cp)`` sub-mesh (HSDP when both are above 1).
FSDP2 takes the mixed-precision policy of the precision certified (``layout.precision``: bf16 parameters for
compute with fp32 reductions under ``bf16-fsdp``, torchtitan's default; none otherwise, the model's own dtype).
The step clips with ``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients (the contract's default hook:
under pp or ep one norm per mesh, torchtitan's; under pp, the contract's ``model`` is already this rank's stage,
and the plan names only the modules it holds)::

    distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 2,4
    distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 2,4 --dtypes float32,bfloat16
    distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 4 \
        --option layout=dp_shard=2,cp=2,ep=4,ep_placement=megatron
"""

from __future__ import annotations


def apply_tp(model, tp_mesh, *, norms: bool = True):
    """torchtitan's ``apply_tp`` for the Llama decoder (torchtitan/models/llama3/infra/parallelize.py);
    ``norms=False`` leaves the RMSNorms off the plan (``examples/step_mutants.py``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    def plan(entries):
        return {k: v for k, v in entries.items() if norms or not isinstance(v, SequenceParallel)}

    # a pipeline stage lacks the embedding (off the first stage) or the final norm and head (off the last):
    # the plan names only what the stage holds (torchtitan's apply_tp does the same)
    top = plan({
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    parallelize_module(model, tp_mesh, {k: v for k, v in top.items() if getattr(model, k) is not None})
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan({
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }))


def mp_policy(layout):
    """FSDP2's ``MixedPrecisionPolicy`` for the precision certified: bf16 compute, fp32 gradient reductions under
    ``bf16-fsdp`` (torchtitan's ``mixed_precision_param = "bfloat16"``, ``mixed_precision_reduce = "float32"``);
    the default (no casting) otherwise."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if layout.precision == "bf16-fsdp":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_cp(model, cp_mesh, attention=None):
    """Every block's attention core a ring over the cp ranks: ``attention(q, k, v, group=...)``, distcheck's
    ring by default. The step hands each cp rank the head-tail chunks of every sequence and their positions."""
    import functools

    from distcheck.parallel.cp.plans import ring_attention

    for block in model.layers.values():
        block.attention.core = functools.partial(attention or ring_attention, group=cp_mesh.get_group())


def apply_moe(model, mesh, layout):
    """The load-balancing loss over the global micro-batch (its counts summed over the ``dp_cp`` ranks), and
    under ep > 1 the experts ``Shard(0)`` over the experts' mesh's ep dim, their tokens dispatched by all-to-all."""
    from torch.distributed.tensor.parallel import parallelize_module

    from distcheck.parallel.step import expert_mesh
    from distcheck.parallel.step.plans import ExpertParallel

    moes = [block.moe for block in model.layers.values() if hasattr(block, "moe")]
    for moe in moes:
        moe.aux_group = mesh["dp_cp"].get_group() if layout.dp_cp > 1 else None
        if layout.ep > 1:
            parallelize_module(moe.experts, expert_mesh(mesh, layout)["ep"], ExpertParallel())


def apply_fsdp(model, dp_mesh, experts_mesh=None, ep=1, *, mp=None, divide_experts=True, router_with_experts=False):
    """FSDP2 on every transformer block, then on the root (torchtitan's ``apply_fsdp``), with the mixed-precision
    policy ``mp`` (default: none); under ep the experts first over their own data-parallel mesh, their gradients
    divided by ep more than FSDP2's average over it (to dp * cp, as every other gradient: pytorch/torchtitan#1551).
    ``divide_experts=False`` and ``router_with_experts=True`` are the mistakes of ``examples/step_mutants.py``."""
    import functools

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from distcheck.parallel.step.plans import divide_experts as divide

    mp = mp or MixedPrecisionPolicy()
    for block in model.layers.values():
        if experts_mesh is not None and hasattr(block, "moe"):
            parts = [block.moe.experts] + ([block.moe.router.gate] if router_with_experts else [])
            for part in parts:
                fully_shard(part, mesh=experts_mesh, mp_policy=mp)
                if divide_experts:
                    part.set_all_reduce_hook(functools.partial(divide, factor=ep))
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def parallelize(model, mesh, layout, *, attention=None, **fsdp_options):
    """``parallelize(model, mesh, layout) -> model``: tp on ``mesh["tp"]``, cp on ``mesh["cp"]``, the MoE layers,
    FSDP2 on ``mesh["dp_replicate", "dp_shard_cp"]`` (the experts on the experts' mesh) with the layout's
    mixed-precision policy."""
    from distcheck.parallel.step import expert_mesh

    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied and layout.pp == 1:  # parallelize_module gives the head its own DTensor: tie again
            model.output.weight = model.tok_embeddings.weight
    if layout.cp > 1:
        apply_cp(model, mesh["cp"], attention)
    apply_moe(model, mesh, layout)
    experts = expert_mesh(mesh, layout)["dp_replicate", "efsdp"] if layout.ep > 1 else None
    fsdp_options.setdefault("mp", mp_policy(layout))
    apply_fsdp(model, mesh["dp_replicate", "dp_shard_cp"], experts, layout.ep, **fsdp_options)
    return model


def parallelize_own_ring(model, mesh, layout):
    """:func:`parallelize` with this folder's ring attention (``examples/my_ring_attention.py``) as the cp core."""
    from examples.my_ring_attention import ring_attention

    return parallelize(model, mesh, layout, attention=ring_attention)
