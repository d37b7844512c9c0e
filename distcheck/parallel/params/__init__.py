"""Parameter counts of decoder-only transformers (Llama-style: GQA, SwiGLU, tied embeddings,
RMS or layer norm, optional biases).

- ``reference``: every tensor of the model listed with its shape, and their sum;
  ``TransformerConfig`` and the presets (Llama 2, Llama 3, the lesson's examples);
- ``forms``: ``params.decoder_only`` and its components, derived by hand from the layer
  structure (an independent derivation of the same number);
- ``strategies``: valid ``TransformerConfig``s;
- ``properties``: reference == closed form, components add up, each option changes the count
  by the closed-form delta;
- ``mutants``: k and v sized without GQA, a tied head counted twice or subtracted twice;
- ``proofs``: the deltas of tying and of GQA, symbolically.

Sources: the Llama 2 and Llama 3 model cards and configs; the lesson "Scaling and
distributed training" (adapted in part from *AI Engineering from Scratch*), section 3.

Public API: this package, ``distcheck.parallel.params``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "TransformerConfig", "param_tensors", "count_params", "component_counts", "PRESETS", "NORMS",
    "MAX_LISTED_LAYERS",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
