"""Mutants of the communication-volume simulations.

===============================  ============================================  ================================
mutant                           mistake                                       killed by
===============================  ============================================  ================================
comm.all_reduce_one_phase        all-reduce counted as its reduce-scatter      comm.volume.closed_form
                                 phase only ((n-1)/n S instead of 2(n-1)/n S)
comm.all_gather_full_tensors     every rank contributes its whole S-byte       comm.zero3.one_and_a_half_ddp
                                 tensor to the all-gather instead of its
                                 S/n shard (gathers n S)
===============================  ============================================  ================================
"""

from __future__ import annotations

from distcheck.core.vocab import Collective
from distcheck.engine.mutants import mutant
from distcheck.parallel.comm.reference import CommResult, simulate

__all__ = ["simulate_all_reduce_one_phase", "simulate_all_gather_full_tensors"]


@mutant("comm.all_reduce_one_phase", "comm.volume.closed_form")
def simulate_all_reduce_one_phase(collective: str, size_bytes: int, n: int, *, dtype: str = "int64") -> CommResult:
    """A ring all-reduce that counts its reduce-scatter phase only, forgetting the all-gather that
    hands every rank the reduced result."""
    return simulate(Collective.REDUCE_SCATTER if collective == Collective.ALL_REDUCE else collective, size_bytes, n,
                    dtype=dtype)


@mutant("comm.all_gather_full_tensors", "comm.zero3.one_and_a_half_ddp")
def simulate_all_gather_full_tensors(collective: str, size_bytes: int, n: int, *,
                                     dtype: str = "int64") -> CommResult:
    """An all-gather in which every rank contributes its whole S-byte tensor instead of its S/n shard
    (the shard convention misread): n S gathered, (n-1) S sent per rank."""
    return simulate(collective, size_bytes * n if collective == Collective.ALL_GATHER else size_bytes, n, dtype=dtype)
