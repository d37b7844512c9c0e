"""Tensor parallelism: linear layers split by columns and by rows, the Megatron MLP (ReLU and
SwiGLU, fused gate/up weights included), layer norm over a sharded hidden dim, and attention
split by heads with grouped-query attention.

- ``reference``: column- and row-parallel linears (uneven shards follow numpy.array_split),
  their float bounds, the MLPs, layer norm and the sharded layer norm with all-reduced
  statistics; ``attention``: attention split by heads, GQA groups kept whole;
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

Public paths: :mod:`distcheck.tp`, :mod:`distcheck.attention`, :mod:`distcheck.forms.tp`,
:mod:`distcheck.forms.attention`, :mod:`distcheck.props.tp`.
"""
