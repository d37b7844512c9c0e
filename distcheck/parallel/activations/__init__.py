"""Activation memory: the bytes one transformer layer keeps for its backward pass.

- ``reference``: the tensors of a layer summed one by one, with what tensor parallelism,
  sequence parallelism and selective or full recomputation split or drop;
- ``forms``: the closed forms of Table 2 (``activations.bytes_per_layer.*``) and Megatron's
  per-layer count.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), §4.1, §4.2 and Table 2; the chapter "Chapter 26: Distributed
Training" of *Language Modelling: The Complete Guide* (its activation figures are audited
against these forms).

Public API: this package, ``distcheck.parallel.activations``: the names of ``__all__``, served on
first access from its internal modules (``reference``). Every module inside the package is internal;
its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "StoredTensor", "LAYER_TENSORS", "RECOMPUTE", "TABLE2_SETTINGS", "stored_tensor_bytes", "bytes_per_layer",
    "table2_bytes_per_layer", "megatron_bytes_per_layer",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
