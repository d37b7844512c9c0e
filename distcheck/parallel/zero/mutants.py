"""Mutants of ZeRO's memory accounting.

===========================  ===========================================  ===================
mutant                       mistake                                      killed by
===========================  ===========================================  ===================
zero.stage2_unsharded_grads  ZeRO-2 that forgets to shard the gradients   zero.bytes.figure1
                             (reports stage 1's bytes)
zero.floor_partition         floor(params / dp) elements per rank: the    zero.bytes.padded
                             remainder belongs to no rank                 (dp not dividing)
zero.stage3_as_stage2        ZeRO-3 that keeps the parameters whole       zero.bytes.monotone
                             (reports stage 2's bytes)
zero.stage3_one_gather       ZeRO-3 communication with one parameter      zero.comm.section7
                             all-gather, forgetting the backward's
===========================  ===========================================  ===================
"""

from __future__ import annotations

from fractions import Fraction

from distcheck.engine.mutants import mutant
from distcheck.parallel.zero.reference import comm_elements_per_rank, model_state_bytes_per_gpu

__all__ = ["zero_floor_partition", "zero_stage2_unsharded_grads", "zero_stage3_as_stage2", "zero_stage3_one_gather"]


@mutant("zero.floor_partition", "zero.bytes.padded")
def zero_floor_partition(params: int, dp: int, stage: int, k: int = 12) -> int:
    """ZeRO partitions of floor(params / dp) elements: the params % dp left over belong to no rank,
    so the bytes per GPU fall below the exact share when dp does not divide params."""
    shard = params // dp
    return {0: (4 + k) * params, 1: 4 * params + k * shard, 2: 2 * params + (2 + k) * shard,
            3: (4 + k) * shard}[stage]


@mutant("zero.stage2_unsharded_grads", "zero.bytes.figure1")
def zero_stage2_unsharded_grads(params: int, dp: int, stage: int, k: int = 12) -> int:
    """ZeRO stage 2 that forgets to shard gradients (reports stage 1's bytes)."""
    return model_state_bytes_per_gpu(params, dp, 1 if stage == 2 else stage, k)


@mutant("zero.stage3_as_stage2", "zero.bytes.monotone")
def zero_stage3_as_stage2(params: int, dp: int, stage: int, k: int = 12) -> int:
    """ZeRO stage 3 that keeps the fp16 parameters whole on every rank (reports stage 2's bytes)."""
    return model_state_bytes_per_gpu(params, dp, 2 if stage == 3 else stage, k)


@mutant("zero.stage3_one_gather", "zero.comm.section7")
def zero_stage3_one_gather(params: int, dp: int, stage: int) -> int | Fraction:
    """ZeRO-3 communication counted with one all-gather of the parameters (the forward's), forgetting
    the backward's: 2 Psi, as DDP, instead of 3 Psi."""
    return comm_elements_per_rank(params, dp, 2 if stage == 3 else stage)
