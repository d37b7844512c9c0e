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
  dropped, as the ZeRO paper counts;
* ``zero.bytes_per_gpu.stage3_with_gather`` (ZeRO-3 model states plus the largest layer gathered whole
  in 16-bit) and its reading ``zero.bytes_per_gpu.stage3_with_gather.deepspeed_estimator``, DeepSpeed's
  ``estimate_zero3_model_states_mem_needs`` without offload: ``largest_layer_memory = 4 x
  largest_layer_params`` (the largest layer gathered in fp32) plus ``int(18 x total_params / total_gpus)``,
  which DeepSpeed prints divided by 2**30 with the label "GB" (binary units: a "GB read as GiB" reading);
* ``comm.busbw.all_reduce.in_network``: an all-reduce's bus bandwidth with the in-network (SHARP)
  factor (n-1)/(n+1) instead of the ring's 2(n-1)/n. Source: nccl-tests, doc/PERFORMANCE.md, section
  "Summary" of "Bandwidth", which lists "AllReduce (In-Network Reduction): (n-1)/(n+1)" beside the
  point-to-point all-reduce's 2(n-1)/n (whose derivation, in its "AllReduce" section, covers send/receive
  algorithms only).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distcheck.audit.quantity import InputValues

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
        def zero(v: InputValues, s: int = s) -> int | Fraction:
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
    largest = I("largest_layer_params", "parameters of the largest layer, gathered whole on every rank", "params",
                "nonnegative_integer")
    out.append(Q(
        "zero.bytes_per_gpu.stage3_with_gather", "bytes",
        "ZeRO paper (Rajbhandari et al. 2020) section 5 (stage 3 shards all model states; each layer's 16-bit "
        "parameters are all-gathered for its forward and backward) and Figure 1",
        "(2 + 2 + K) Psi / N_d (zero.bytes_per_gpu.stage3) + gather_bytes x largest_layer_params: the largest layer "
        "gathered whole",
        _form_inputs("zero.bytes_per_gpu.stage3") + (largest, I(
            "gather_bytes", "bytes per parameter of the gathered layer (16-bit: 2)", "bytes_per_param", "positive", 2)),
        lambda v: _ev("zero.bytes_per_gpu.stage3", **_pick(v, ("params", "dp", "k")))
        + v["gather_bytes"] * v["largest_layer_params"],
    ))
    out.append(Q(
        "zero.bytes_per_gpu.stage3_with_gather.deepspeed_estimator", "bytes",
        "DeepSpeed deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs (cpu_offload=False): "
        "largest_layer_memory = 4 * largest_layer_params; gpu_mem = largest_layer_memory + int(18 * total_params / "
        "total_gpus); printed as gpu_mem / 2**30 with the label GB",
        "floor(18 Psi / N) + 4 x largest_layer_params: 18 B/param sharded (2 + 2 + 14) and the largest layer "
        "gathered in fp32",
        (_form_inputs("zero.bytes_per_gpu.stage3", drop=("k",)) + (largest,)),
        lambda v: (18 * v["params"]) // v["dp"] + 4 * v["largest_layer_params"],
    ))
    out.append(Q(
        "comm.busbw.all_reduce.in_network", "bytes_per_second",
        "in-network (SHARP) all-reduce bus-bandwidth factor (n-1)/(n+1): nccl-tests doc/PERFORMANCE.md, "
        "Bandwidth, Summary ('AllReduce (In-Network Reduction)')",
        "bus bandwidth of an in-network all-reduce: algbw x (n-1)/(n+1)",
        _form_inputs("comm.busbw.all_reduce"),
        lambda v: Fraction(v["size_bytes"]) / v["time_s"] * (v["n"] - 1) / (v["n"] + 1),
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
