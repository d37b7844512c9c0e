"""torch's own composition for distcheck's tiny Llama, as a torchtitan-style parallelize function:
tensor parallelism with ``parallelize_module`` (torchtitan's Llama plan: sequence-parallel norms,
column-parallel q/k/v and w1/w3, row-parallel wo and w2, a row-parallel embedding and a column-parallel
head) on the mesh's ``tp`` dimension, then FSDP2's ``fully_shard`` on every block and the root over the
``(dp_replicate, dp_shard)`` sub-mesh (HSDP when both are above 1); the step clips with
``torch.nn.utils.clip_grad_norm_`` on the DTensor gradients (the contract's default hook; under pp, the
contract's ``model`` is already this rank's stage, and the plan names only the modules it holds). FSDP2 takes
the mixed-precision policy of the precision certified (``layout.precision``: bf16 parameters for compute with
fp32 reductions under ``bf16-fsdp``, torchtitan's default; none otherwise, the model's own dtype)::

    distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 4
    distcheck certify examples.my_step:parallelize --contract training-step --world-sizes 2,4 --dtypes float32,bfloat16
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


def apply_fsdp(model, dp_mesh, mp=None):
    """FSDP2 on every transformer block, then on the root (torchtitan's ``apply_fsdp``), with the mixed-precision
    policy ``mp`` (default: none)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp or MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)


def parallelize(model, mesh, layout):
    """``parallelize(model, mesh, layout) -> model``: tp on ``mesh["tp"]``, FSDP2 on ``mesh["dp_replicate",
    "dp_shard"]`` with the layout's mixed-precision policy."""
    if layout.tp > 1:
        apply_tp(model, mesh["tp"])
        if model.config.tied:  # parallelize_module gives the head its own DTensor: tie it again (pp = 1 only)
            model.output.weight = model.tok_embeddings.weight
    apply_fsdp(model, mesh["dp_replicate", "dp_shard"], mp_policy(layout))
    return model
