"""ZeRO (stages 0-3) and FSDP: how data parallelism shards the optimizer state, the gradients
and the parameters, what that saves per GPU, and what it costs in communication.

- ``reference``: per-rank shards of real parameter lists under flat, FSDP2 and ZeRO-Redundancy
  partitioning, bytes per GPU per stage, elements each rank sends per step;
- ``forms``: ``zero.bytes_per_gpu.stage0..3``, ``zero.comm_elements_per_rank.*`` (the paper's
  count) and ``zero.comm_bytes_per_rank.*`` (bytes, with the ring factor (n-1)/n);
- ``strategies``: parameter counts, dp, optimizer bytes K;
- ``properties``: bytes == Figure 1 (padded when dp does not divide Psi), monotone in stage
  and dp, communication == §7;
- ``mutants``: ZeRO-2 with unsharded gradients, floor partitions;
- ``proofs``: baseline at dp = 1, stages non-increasing, ZeRO-3 = 1.5 x DDP.

Sources: Rajbhandari, Rasley, Ruwase, He 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models" (SC'20, arXiv:1910.02054), Figure 1 and §7; PyTorch FSDP2's
``fully_shard`` (dim-0 sharding, padded); NVIDIA nccl-tests ``doc/PERFORMANCE.md`` (ring factor).

Public API: this package, ``distcheck.parallel.zero``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "SCHEMES", "RankBytes", "ZeroPartition", "normalize_shapes", "flat_shard_elements", "fsdp2_shard_rows",
    "fsdp2_shard_elements", "zero_redundancy_assignment", "zero_redundancy_shard_elements", "shard_elements",
    "partition", "model_state_bytes_per_gpu", "comm_elements_per_rank",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
