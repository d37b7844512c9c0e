"""Proofs (sympy) of the parameter count's options, for every value of the symbols.

- tying the embeddings removes exactly V d (vocab_size x hidden_size);
- grouped-query attention: MHA - GQA = 2 L (H - G) e (d + qkv_bias) (num_layers L, heads H,
  kv heads G, head_dim e).
"""

from __future__ import annotations

import sympy as sp

from distcheck.engine.catalogue import get
from distcheck.engine.proofs import proof, zero

__all__ = ["params_option_deltas"]


@proof("proof.params.option_deltas")
def params_option_deltas() -> tuple[bool, str]:
    """decoder_only: tied=1 minus tied=0 == -V d; num_kv_heads=H minus G == 2 L d e (H - G) (+ qkv bias 2 e (H-G))."""
    f = get("params.decoder_only")
    s = f.symbols
    tied = f.expr.subs(s["tied"], 1) - f.expr.subs(s["tied"], 0)
    ok_tied = zero(tied + s["vocab_size"] * s["hidden_size"])
    H, G, L, d, e = s["num_heads"], s["num_kv_heads"], s["num_layers"], s["hidden_size"], s["head_dim"]
    gqa = f.expr.subs(G, H) - f.expr
    ok_gqa = zero(gqa - L * (H - G) * (2 * d * e + 2 * e * s["qkv_bias"]))
    return ok_tied and ok_gqa, f"tied: {sp.simplify(tied)}; MHA - GQA: {sp.factor(sp.simplify(gqa))}"
