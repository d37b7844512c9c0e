"""Collectives: the bytes each rank sends in an all-reduce, all-gather, reduce-scatter,
all-to-all or broadcast, simulated on real arrays and in closed form.

- ``reference``: ring (and chain, direct) algorithms moving numpy arrays between simulated
  ranks, counting bytes and checking their own results; ``ideal``: the ideal per-rank
  bytes, exactly, under the full-tensor or the per-rank-shard convention;
- ``forms``: ``comm.bytes_per_rank.*``; measured bandwidth ``comm.algbw`` and ``comm.busbw.*``;
- ``strategies``: a collective, the full tensor's bytes, the ranks;
- ``properties``: simulations == closed forms (uneven chunks included); ZeRO-3 = 1.5 x DDP;
- ``proofs``: all-reduce = reduce-scatter + all-gather.

Sources: NVIDIA nccl-tests, ``doc/PERFORMANCE.md`` (bus bandwidth factors); Rajbhandari et
al. 2020, "ZeRO" (arXiv:1910.02054), §7.

Public API: this package, ``distcheck.parallel.comm``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "COLLECTIVES", "CONVENTIONS", "CommResult", "ring_all_reduce", "ring_all_gather", "ring_reduce_scatter",
    "all_to_all", "chain_broadcast", "simulate", "volume", "bus_bandwidth_factor", "sum_error_bound",
    "MAX_SIM_RANKS", "MAX_SIM_ELEMENTS",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
