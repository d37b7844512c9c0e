"""More auditable composites: the ZeRO state by component, a total read as the maximum of its
components, and ZeRO communication bytes without the ring factor.

They exist so that the conventions of :mod:`distcheck.audit.conventions` can name how a source
(or a library's estimator, :mod:`distcheck.libs`) counted:

* ``zero.bytes_per_gpu.components.stage{0..3}``: the ZeRO paper's Figure 1 with the bytes of
  the weights and gradients as inputs (default 2 and 2, the paper's), so that "fp32 gradients
  instead of 16-bit ones" (4), "fp32 gradients on top of 16-bit ones" (6, DeepSpeed's ZeRO-2
  estimator) and "fp32 weights with no separate master copy" (4 + 4 + K = 8) are readings of a
  ``zero.bytes_per_gpu.*`` figure;
* ``memory.max_of_state_and_activations_bytes`` and ``memory.per_gpu_bytes_max.zero{0..3}``:
  the maximum of the training state and the activations, where the sum is meant (accelerate's
  ``estimate-memory`` takes the maximum of its components);
* ``zero.comm_bytes_per_rank_no_ring_factor.*``: ``zero.comm_bytes_per_rank.*`` with (n-1)/n
  dropped, as the ZeRO paper counts.
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["composites"]

_FIG1 = "ZeRO paper (Rajbhandari et al. 2020) Figure 1 and section 5, with the bytes of each component as inputs"


def composites() -> list:
    """The quantities above (:class:`distcheck.audit.quantity.Quantity` each)."""
    from distcheck.audit.quantity import Quantity as Q
    from distcheck.audit.quantity import QuantityInput as I
    from distcheck.audit.quantity import _ev, _form_inputs, _pick

    out = []
    w_in = I("weight_bytes", "bytes per parameter of the working weights", "bytes_per_param", "positive", 2)
    g_in = I("grad_bytes", "bytes per parameter of the gradients", "bytes_per_param", "positive", 2)
    for s in range(4):
        def zero(v, s=s):
            w, g, k = v["weight_bytes"], v["grad_bytes"], v["k"]
            sharded = (k if s >= 1 else 0) + (g if s >= 2 else 0) + (w if s >= 3 else 0)
            return (w + g + k - sharded) * v["params"] + Fraction(sharded * v["params"]) / v["dp"]
        out.append(Q(
            f"zero.bytes_per_gpu.components.stage{s}", "bytes", _FIG1,
            f"zero.bytes_per_gpu.stage{s} with weight_bytes and grad_bytes as inputs: stage 1 shards K, stage 2 also "
            "the gradients, stage 3 also the weights",
            _form_inputs(f"zero.bytes_per_gpu.stage{s}") + (w_in, g_in), zero,
        ))
    act = I("activation_bytes", "activation bytes per GPU", "bytes", "nonnegative", 0)
    out.append(Q(
        "memory.max_of_state_and_activations_bytes", "bytes",
        "accelerate estimate-memory (the training figure is the maximum of its components); read where "
        "memory.state_plus_activations_bytes, the sum, is meant",
        "max(memory.train_state_bytes, activation_bytes): the larger component instead of their sum",
        _form_inputs("memory.train_state_bytes") + (act,),
        lambda v: max(Fraction(_ev("memory.train_state_bytes", **_pick(v, ("params", "bytes_per_param", "tp", "pp")))),
                      Fraction(v.get("activation_bytes", 0))),
    ))
    for s in range(4):
        out.append(Q(
            f"memory.per_gpu_bytes_max.zero{s}", "bytes",
            "accelerate estimate-memory (maximum of the components); read where memory.per_gpu_bytes.zero* is meant",
            f"max(zero.bytes_per_gpu.stage{s}, activation_bytes): the larger component instead of their sum",
            _form_inputs(f"zero.bytes_per_gpu.stage{s}") + (act,),
            lambda v, s=s: max(Fraction(_ev(f"zero.bytes_per_gpu.stage{s}", **_pick(v, ("params", "dp", "k")))),
                               Fraction(v.get("activation_bytes", 0))),
        ))
    for k, c in (("ddp", 2), ("stage1", 2), ("stage2", 2), ("stage3", 3)):
        out.append(Q(
            f"zero.comm_bytes_per_rank_no_ring_factor.{k}", "bytes",
            "ZeRO paper (Rajbhandari et al. 2020) section 7: Psi per collective, the ring factor (n-1)/n dropped",
            f"{c} x Psi x bytes_per_element: zero.comm_bytes_per_rank.{k} without (n-1)/n",
            _form_inputs(f"zero.comm_bytes_per_rank.{k}"),
            lambda v, c=c: c * v["params"] * v["bytes_per_element"],
        ))
    return out
