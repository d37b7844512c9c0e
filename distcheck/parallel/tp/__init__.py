"""Tensor parallelism: linear layers split by columns and by rows, the Megatron MLP (ReLU and
SwiGLU, fused gate/up weights included), layer norm over a sharded hidden dim, and attention
split by heads with grouped-query attention.

- ``reference``: column- and row-parallel linears (uneven shards follow numpy.array_split),
  their float bounds, the MLPs, layer norm and the sharded layer norm with all-reduced
  statistics; ``heads``: attention split by heads, GQA groups kept whole; ``vocab``: the
  vocab-parallel embedding and cross-entropy;
- ``forms``: shard sizes, all-reduces per forward, communication per layer, heads per rank;
- ``strategies``: linear layers, MLPs, norm and attention cases over any tp;
- ``properties``: each sharded block == the single-device block, bit for bit or within the
  derived bound, with the all-reduce count the closed form states;
- ``mutants``: row-then-column MLP, per-shard layer norm, bias on every rank, a fused weight
  split naively, dropped remainder rows, an unrecorded all-reduce.

Sources: Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models
Using Model Parallelism" (arXiv:1909.08053), §3 and Figure 3; Narayanan et al. 2021
(arXiv:2104.04473), §3.2 (communication); Shazeer 2020, "GLU Variants Improve Transformer"
(SwiGLU); Ainslie et al. 2023 (GQA); the lesson "Scaling and distributed training" (adapted
in part from *AI Engineering from Scratch*), "Tensor parallelism: columns and rows".

Public API: this package, ``distcheck.parallel.tp``: the names of ``__all__``, served on first
access from its internal modules (``reference``, ``heads``, ``vocab``). Every module inside the
package is internal; its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "ACTIVATIONS", "activation", "split_sizes", "split_bounds", "column_parallel_parts", "column_parallel",
    "column_parallel_error_bound", "row_parallel_parts", "row_parallel", "row_parallel_error_bound", "mlp",
    "megatron_mlp", "silu", "swiglu_mlp", "tp_swiglu_mlp", "shard_fused_gate_up", "tp_swiglu_mlp_fused",
    "layer_norm", "sharded_layer_norm", "validate_heads", "validate_tp_heads", "head_dim_of", "attention_heads",
    "attention", "tp_head_ranges", "tp_attention_parts", "tp_attention", "REDUCTIONS", "vocab_range",
    "vocab_parallel_embedding_parts", "vocab_parallel_embedding", "embedding_weight_grad", "cross_entropy",
    "cross_entropy_grad", "vocab_parallel_cross_entropy",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "heads", "vocab"))
