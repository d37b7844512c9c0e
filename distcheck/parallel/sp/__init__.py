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

Public API: this package, ``distcheck.parallel.sp``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "sequence_bounds", "sequence_shards", "layer_norm", "dropout", "mlp_block", "sp_mlp_block",
    "attention_block", "sp_attention_block", "layer_norm_param_grads", "sp_layer_norm_param_grads",
    "all_gather_sequence", "reduce_scatter_sequence",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
