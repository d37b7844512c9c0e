"""FLOPs of a training step and the throughput figures built on them (MFU, HFU, tokens per second).

- ``reference``: the FLOPs of a decoder counted matmul by matmul from its shape (the projections,
  the MLP, the attention scores and the attention over the values, the output head; dense
  :class:`~distcheck.parallel.params.TransformerConfig` and mixture-of-experts
  :class:`~distcheck.parallel.ep.MoEConfig` models), the forward run again by full or selective
  recomputation, and MFU and HFU from a measured throughput;
- ``forms``: the closed forms: model FLOPs per token ``6 P + 12 L s W`` (P the parameters that
  multiply a token, W the attention width), the extra FLOPs of recomputation, the per-iteration
  formulas of Narayanan et al. 2021 and Korthikanti et al. 2022, MFU and HFU, the utilization of a
  FLOP rate, tokens per second, GPU-hours and compute time;
- ``proofs``: the published GPT formulas equal the general form at P = 12 l h^2 + V h.

Conventions: one multiply-add is 2 FLOPs; a backward costs twice its forward (the gradients of the
inputs and of the weights); the attention scores are counted over the full s x s square (no causal
halving), as PaLM's Appendix B counts them; the input embedding is a lookup (0 FLOPs), the output
head a matmul (2 V h per token forward); norms, activations, softmax and the optimizer are left out.

Sources: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways"
(arXiv:2204.02311), Appendix B (MFU, HFU, 6N + 12LHQT); Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (arXiv:2104.04473), §5.1
(96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration with recomputation); Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198), §5
(what selective recomputation runs again) and its model-FLOPs formula 72 B s l h^2 (1 + s/6h +
V/12lh); Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (arXiv:2001.08361), §2.1
(C = 6N: 2N forward, 4N backward per token).

Public API: this package, ``distcheck.parallel.flops``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`.
"""

from distcheck.core.face import face

__all__ = [
    "RECOMPUTE", "MOE_ATTENTION", "TrainingFlops", "forward_flops_per_token", "moe_forward_flops_per_token",
    "matmul_params", "moe_matmul_params", "training_flops_per_token", "moe_training_flops_per_token",
    "mfu", "hfu",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
