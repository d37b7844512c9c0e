"""ZeRO-1 and FSDP2 on a real world: their rows of ``distcheck check``'s layers stage.

torch's ``ZeroRedundancyOptimizer`` and ``fully_shard`` (with ``reshard_after_forward`` True,
ZeRO-3, and False, ZeRO-2-like), certified under the sharded optimizer step contract
(:mod:`distcheck.parallel.zero.contracts`) on every world of the stage: Hypothesis draws the
models, the batches, the optimizer (SGD, SGD with momentum, Adam) and its steps in the parent,
every example runs on every rank of the pool, failures are shrunk there. Rows
``<run>.params`` (bitwise equal to a single-device step on the full batch) and
``<run>.bytes_per_rank`` (each rank's storage equal to the ZeRO references), each with its
example count.

What the rows have shown (torch 2.13): FSDP2's optimizer state is *not* padded (Adam's
``zeros_like`` of the local rows), while its parameters and gradients are; the references say
so, and the rows pass.
"""

from __future__ import annotations

from distcheck.engine.contracts.contract import ContractRun

__all__ = ["CERTIFY", "PRELOAD", "STAGE"]

#: these checks join the layers stage of ``distcheck check``
STAGE = "layers"
#: imported by a pool's parent before forking (their first use is slow on every rank)
PRELOAD = ("torch.distributed.optim", "torch.distributed.fsdp")

_CONTRACT = "sharded-optimizer-step"
_FULLY_SHARD = "torch.distributed.fsdp:fully_shard"

CERTIFY = (
    ContractRun("zero1", _CONTRACT, "torch.distributed.optim:ZeroRedundancyOptimizer",
                doc="ZeRO-1: whole parameters' state on their owner, the update broadcast back"),
    ContractRun("fsdp2[reshard=True]", _CONTRACT, _FULLY_SHARD, {"reshard_after_forward": True},
                doc="FSDP2 resharding after the forward (ZeRO-3)"),
    ContractRun("fsdp2[reshard=False]", _CONTRACT, _FULLY_SHARD, {"reshard_after_forward": False},
                doc="FSDP2 keeping the parameters gathered for the backward"),
)
