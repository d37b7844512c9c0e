"""Collectives: the bytes each rank sends in an all-reduce, all-gather, reduce-scatter,
all-to-all or broadcast, simulated on real arrays and in closed form.

- ``reference``: ring (and chain, direct) algorithms moving numpy arrays between simulated
  ranks, counting bytes and checking their own results; ``volume``: the ideal per-rank
  bytes, exactly, under the full-tensor or the per-rank-shard convention;
- ``forms``: ``comm.bytes_per_rank.*``; measured bandwidth ``comm.algbw`` and ``comm.busbw.*``;
- ``strategies``: a collective, the full tensor's bytes, the ranks;
- ``properties``: simulations == closed forms (uneven chunks included); ZeRO-3 = 1.5 x DDP;
- ``proofs``: all-reduce = reduce-scatter + all-gather.

Sources: NVIDIA nccl-tests, ``doc/PERFORMANCE.md`` (bus bandwidth factors); Rajbhandari et
al. 2020, "ZeRO" (arXiv:1910.02054), §7.

Public paths: :mod:`distcheck.comm`, :mod:`distcheck.forms.comm`, :mod:`distcheck.props.comm`.
"""
