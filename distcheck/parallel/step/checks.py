"""The training step on a real world: its rows of ``distcheck check``'s layers stage.

torch's composition (:func:`distcheck.parallel.step.plans.fsdp2_tp`: ``fully_shard`` over the dp axes,
``parallelize_module`` with torchtitan's Llama plan over ``tp``, ``clip_grad_norm_`` on the DTensor
gradients) certified under the ``training-step`` contract on every world of the stage from two ranks
(one rank is the single-device step: skip rows with the contract's reason). Hypothesis draws the
layout among the world's factorisations, the decoder, micro-batches, padded lengths, the clip threshold,
the learning rate and 2 or 3 steps; one world run per example serves every property. Rows
``step.torch_fsdp2_tp.<property>`` (params, loss, grad_norm, clipping, tokens). An example is a whole
step of every rank (a model built and parallelized, 2 or 3 steps of micro-batches, every parameter and
AdamW moment gathered), about a second on two cores, so the run takes :data:`EXAMPLES` examples per
property and world under every profile; ``distcheck certify`` takes the profile's count.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "PRELOAD", "STAGE", "EXAMPLES"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"
#: the modules the pool's parent imports before forking (the ranks do not import them again)
PRELOAD = ("torch.distributed.fsdp", "torch.distributed.tensor.parallel")
#: examples per property and world in ``distcheck check`` (each a whole training step of every rank)
EXAMPLES = 2

CERTIFY = (
    ContractRun("step.torch_fsdp2_tp", "training-step", "distcheck.parallel.step.plans:fsdp2_tp",
                max_examples=EXAMPLES,
                doc="torch's fully_shard x parallelize_module (torchtitan's Llama plan) with clip_grad_norm_ on "
                    "DTensor gradients"),
)
