"""Activation memory: the bytes one transformer layer keeps for its backward pass.

- ``reference``: the tensors of a layer summed one by one, with what tensor parallelism,
  sequence parallelism and selective or full recomputation split or drop;
- ``forms``: the closed forms of Table 2 (``activations.bytes_per_layer.*``) and Megatron's
  per-layer count.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), §4.1, §4.2 and Table 2; the chapter "Chapter 26: Distributed
Training" of *Language Modelling: The Complete Guide* (its activation figures are audited
against these forms).

Public paths: :mod:`distcheck.activations`, :mod:`distcheck.forms.activations`.
"""
