"""Sequence parallelism: the layer norms and dropouts of a tensor-parallel transformer layer run on
sequence shards, and the all-reduce of each tensor-parallel block becomes a reduce-scatter (after
the row-parallel linear) and an all-gather (before the column-parallel linear).

- ``reference``: the single-device blocks (layer norm, MLP or attention, dropout, residual), their
  sequence-parallel versions over any tp, and the layer norm's parameter gradients, summed over the
  sequence shards by one all-reduce;
- ``forms``: the collectives per block, the bytes each rank sends (reduce-scatter + all-gather, the
  same as the all-reduce they replace), the activation bytes sequence parallelism saves;
- ``proofs``: those bytes equal the ring all-reduce's; Table 2's tensor-parallel row minus its
  tensor + sequence parallel row is the saving;
- ``strategies``: blocks whose layer norm is exact (rows ``m + c z``, z a balanced +-1 vector);
- ``properties``: each sequence-parallel block == the single-device block, bit for bit (MLP) or
  within the derived bound (attention), with one all-gather and one reduce-scatter per forward;
  layer-norm gradients bit for bit; the bytes and the activation saving against the closed forms;
- ``mutants``: layer-norm statistics over the sequence shard, layer-norm gradients left on the
  shard, one dropout mask on every rank, an all-reduce kept in place of the reduce-scatter;
- ``contracts``: ``sequence-parallel-mlp``, a user's sequence-parallel block certified on a real
  world against the tensor-parallel block on the whole sequence; ``plans``: torch's
  ``SequenceParallel`` with the tensor-parallel plan; ``checks``: that plan in the layers stage of
  ``distcheck check``.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), §4.2.2 and Figure 5 (the operators g and g-bar), Table 2 (activation bytes);
Shoeybi et al. 2019, "Megatron-LM" (arXiv:1909.08053), §3 (the blocks); nccl-tests
doc/PERFORMANCE.md (bytes per rank of the ring collectives).

Public path: :mod:`distcheck.parallel.sp` (its role modules, found by discovery).
"""
