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

Public paths: :mod:`distcheck.params`, :mod:`distcheck.forms.params`, :mod:`distcheck.props.params`.
"""
