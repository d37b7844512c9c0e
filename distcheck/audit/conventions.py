"""Documented conventions, as data: what else a figure may have meant.

When a claim fails under the default reading (the quantity it names, the inputs
it gives, the unit it prints), the audit tries the named alternatives listed
here. Each :class:`Axis` is one question a source may answer differently (bytes
per parameter, GB or GiB, bubble relative to total or ideal time, ...); each
:class:`Variant` on an axis is one documented answer, expressed as

* ``quantity``: another catalogue quantity to compute instead (same inputs),
* ``set``: inputs replaced by a value (a number, a :class:`FormValue` naming a
  closed form without inputs, :class:`InputValue` naming another input, or
  :data:`NOMINAL_PARAMS`),
* ``scale``: inputs multiplied (or divided, ``invert=True``) by a constant or by
  the product of other inputs,
* ``unit``: the claim's figure read in another unit (GB printed, GiB meant).

Variants of different axes combine (at most :data:`MAX_CHANGES` at once); the
audit prefers the fewest changes. Nothing here is code to evaluate: every
transformation is one of these records.

Sources: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and Figure 1 (16 bytes per parameter, K = 12); Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
§2.2 (bubble relative to ideal time) and Huang et al. 2019, "GPipe", §2.3 (relative to
total time); Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2; nccl-tests, doc/PERFORMANCE.md (collective volumes); Qi et al.
2023, "Zero Bubble Pipeline Parallelism", Table 2 (B = the input-gradient pass) and DeepSeek-AI
2024, "DeepSeek-V3 Technical Report", Table 2 (B = the full backward); the zero-bubble
repository's README (zero bubble without a barrier between steps: optimizer post-validation);
Rajbhandari et al. 2020 §7 with nccl-tests' ring factor (n-1)/n (the element counts 2 Psi and
3 Psi read per rank on a ring of n: 2(n-1)/n Psi and 3(n-1)/n Psi); Chowdhery et al. 2022, "PaLM", Appendix B
(MFU with the attention term 12 L H Q T) and Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1
(C = 6N, attention left out); NVIDIA's datasheets (Tensor Core peaks printed with 2:4 sparsity, twice the dense).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from distcheck.core.validate import check_type
from distcheck.core.vocab import Collective, Schedule

__all__ = [
    "MAX_CHANGES",
    "FormValue",
    "NOMINAL_PARAMS",
    "InputValue",
    "Scale",
    "Variant",
    "Axis",
    "CONVENTIONS",
    "UNIT_ALTERNATIVES",
    "axes_for",
    "apply_variant",
    "describe_conventions",
]

#: the most axes changed at once when searching for a convention that reproduces a figure
MAX_CHANGES = 2


@dataclass(frozen=True)
class FormValue:
    """The value of a closed form without inputs, e.g. ``memory.bytes_per_param.moments_only``."""

    name: str


@dataclass(frozen=True)
class _NominalParams:
    """The parameter count printed in the preset's name (70e9 for llama-3-70b)."""


NOMINAL_PARAMS = _NominalParams()


@dataclass(frozen=True)
class InputValue:
    """The value of another input of the same claim (after defaults)."""

    name: str


#: what a variant sets an input to: a number, or a value found when it is applied
SetValue = int | Fraction | FormValue | InputValue | _NominalParams


@dataclass(frozen=True)
class Scale:
    """Multiply an input by ``factor`` times the product of the inputs in ``by``
    (or divide by it when ``invert``)."""

    factor: Fraction = Fraction(1)
    by: tuple[str, ...] = ()
    invert: bool = False


@dataclass(frozen=True)
class Variant:
    """One documented alternative reading of a figure (see the module docstring)."""

    name: str
    description: str
    quantity: str | None = None
    set: Mapping[str, SetValue] = field(default_factory=dict)
    scale: Mapping[str, Scale] = field(default_factory=dict)
    unit: str | None = None
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Axis:
    """One question sources answer differently; ``variants`` are the alternatives to the
    claim as written (which is always the default)."""

    name: str
    variants: tuple[Variant, ...]


def _bpp(conv: str, label: str) -> Variant:
    return Variant(label, f"bytes_per_param = memory.bytes_per_param.{conv}",
                   set={"bytes_per_param": FormValue(f"memory.bytes_per_param.{conv}")})


_BYTES_PER_PARAM = Axis("bytes per parameter", (
    _bpp("mixed_adamw", "16 B/param (bf16 weights and grads, fp32 master, Adam m and v)"),
    _bpp("moments_only", "12 B/param (no fp32 master copy)"),
    _bpp("mixed_adamw_fp32_grads", "18 B/param (fp32 gradients)"),
    _bpp("adam_8bit", "10 B/param (8-bit Adam moments)"),
    Variant("20 B/param (fp32 gradients on top of 16-bit ones)", "bytes_per_param = 2 + 2 + 4 + 12 = 20",
            set={"bytes_per_param": Fraction(20)}),
))

_OPTIMIZER = Axis("optimizer state per parameter", (
    Variant("12 B/param of optimizer state (fp32 master + Adam m, v)", "optimizer_bytes_per_param = 12",
            set={"optimizer_bytes_per_param": Fraction(12)}),
    Variant("8 B/param of optimizer state (Adam m, v only: no fp32 master)", "optimizer_bytes_per_param = 8",
            set={"optimizer_bytes_per_param": Fraction(8)}),
    Variant("6 B/param of optimizer state (fp32 master + 8-bit moments)", "optimizer_bytes_per_param = 6",
            set={"optimizer_bytes_per_param": Fraction(6)}),
    Variant("2 B/param of optimizer state (8-bit moments, no master)", "optimizer_bytes_per_param = 2",
            set={"optimizer_bytes_per_param": Fraction(2)}),
))

_ZERO_K = Axis("ZeRO K (optimizer bytes per parameter)", (
    Variant("K = 12 (fp32 master + Adam m, v)", "k = 12", set={"k": Fraction(12)}),
    Variant("K = 8 (Adam m, v only: no fp32 master)", "k = 8", set={"k": Fraction(8)}),
    Variant("K = 6 (fp32 master + 8-bit moments)", "k = 6", set={"k": Fraction(6)}),
    Variant("K = 14 (18 B/param sharded at stage 3: DeepSpeed's ZeRO-3 estimator)", "k = 14",
            set={"k": Fraction(14)}),
    Variant("K = 16 (fp32 gradients counted with the optimizer state: DeepSpeed's ZeRO-2 estimator)", "k = 16",
            set={"k": Fraction(16)}),
))


def _zero_precision(stage: str) -> Axis:
    q = f"zero.bytes_per_gpu.components.{stage}"
    return Axis("precision of the ZeRO state", (
        Variant("fp32 gradients instead of 16-bit ones (2 + 4 + K)", "grad_bytes = 4", quantity=q,
                set={"grad_bytes": Fraction(4)}),
        Variant("fp32 gradients on top of 16-bit ones (2 + 2 + 4 + K)", "grad_bytes = 6", quantity=q,
                set={"grad_bytes": Fraction(6)}),
        Variant("fp32 weights with no separate master copy (4 + 4 + 8)", "weight_bytes = 4, grad_bytes = 4, k = 8",
                quantity=q, set={"weight_bytes": Fraction(4), "grad_bytes": Fraction(4), "k": Fraction(8)}),
    ))


_MAX_NOT_SUM = "the maximum of the components instead of their sum (state, activations)"

_WEIGHT_BYTES = Axis("weight precision", (
    Variant("fp32 weights (4 B/param)", "weight_bytes = 4", set={"weight_bytes": Fraction(4)}),
    Variant("16-bit weights (2 B/param)", "weight_bytes = 2", set={"weight_bytes": Fraction(2)}),
))
_GRAD_BYTES = Axis("gradient precision", (
    Variant("fp32 gradients (4 B/param)", "grad_bytes = 4", set={"grad_bytes": Fraction(4)}),
    Variant("16-bit gradients (2 B/param)", "grad_bytes = 2", set={"grad_bytes": Fraction(2)}),
    Variant("fp32 gradients on top of 16-bit ones (6 B/param)", "grad_bytes = 2 + 4",
            set={"grad_bytes": Fraction(6)}),
))

_ACT_SHARDED_DP = Axis("activations replicated or sharded", (
    Variant("activations sharded across the dp ranks (not replicated on each)", "activation_bytes / dp",
            scale={"activation_bytes": Scale(by=("dp",), invert=True)}),
))
_ACT_SHARDED_TP_PP = Axis("activations replicated or sharded", (
    Variant("activations sharded t x p ways like the weights (not replicated)", "activation_bytes / (tp pp)",
            scale={"activation_bytes": Scale(by=("tp", "pp"), invert=True)}),
))


def _bubble_axis(schedule: str, to: str) -> Axis:
    if to == "ratio":
        return Axis("bubble relative to total or to ideal time", (Variant(
            "bubble relative to ideal (useful) time", f"pp.bubble_ratio.{schedule}: idle / ideal, (p-1)/m",
            quantity=f"pp.bubble_ratio.{schedule}"),))
    return Axis("bubble relative to total or to ideal time", (Variant(
        "bubble relative to total time", f"pp.bubble_fraction.{schedule}: idle / total, (p-1)/(m+p-1)",
        quantity=f"pp.bubble_fraction.{schedule}"),))


_ACT_ROWS = ("none", "tp", "tp_sp", "tp_selective", "tp_sp_selective", "full_recompute")
_ACT_LABEL = {
    "none": "no parallelism, everything stored",
    "tp": "tensor parallel, activations outside TP regions replicated",
    "tp_sp": "tensor + sequence parallel (activations sharded)",
    "tp_selective": "tensor parallel + selective recompute (replicated)",
    "tp_sp_selective": "tensor + sequence parallel + selective recompute (sharded)",
    "full_recompute": "full recompute (layer inputs only)",
}


def _act_axis(prefix: str, own: str) -> Axis:
    return Axis("which activations are stored, replicated or sharded", tuple(
        Variant(_ACT_LABEL[r], f"{prefix}.{r} (Korthikanti et al. 2022 Table 2)", quantity=f"{prefix}.{r}")
        for r in _ACT_ROWS if r != own))


_PARAM_COUNT = Axis("parameter count of a named model", (
    Variant("nominal parameter count from the model name", "params = the size in the name (70e9 for llama-3-70b)",
            set={"params": NOMINAL_PARAMS}, needs=("model", "params")),
))

def _b_axis(prefix: str, own: str) -> Axis:
    """What a printed backward cost B means: the input-gradient pass only (Qi et al. 2023,
    "Zero Bubble Pipeline Parallelism", T_B) or the full backward (DeepSeek-V3 Table 2, the
    DualPipe README): the same figure read the other way."""
    other = "b_full" if own == "b_input" else "b_input"
    label = ("B is the full backward (input and weight gradients: DeepSeek-V3 Table 2)" if other == "b_full" else
             "B is the input-gradient pass only (Qi et al. 2023, T_B)")
    return Axis("what B means: the input-gradient pass or the full backward", (Variant(
        label, f"{prefix}.{other}", quantity=f"{prefix}.{other}"),))


def _steady_axis(name: str) -> Axis:
    return Axis("a barrier between steps, or none (optimizer post-validation)", (Variant(
        "no barrier between steps: the idle ticks inside each rank's own window (steps overlap)", f"{name}.steady",
        quantity=f"{name}.steady"),))


_BACKWARD = Axis("cost of a backward pass", (
    Variant("backward costs as much as forward (t_b = t_f)", "t_b = t_f", set={"t_b": InputValue("t_f")}),
))


def _comm_axes(op: str) -> tuple[Axis, ...]:
    return (
        Axis("full tensor size or shard size", (Variant(
            "size given is the per-rank shard (full tensor = n x size)", "size_bytes x n",
            scale={"size_bytes": Scale(by=("n",))}),)),
        Axis("ring factor (n-1)/n", (Variant(
            "ring factor (n-1)/n dropped (the large-n limit; the ZeRO paper counts volumes this way)",
            f"comm.bytes_per_rank_no_ring_factor.{op}", quantity=f"comm.bytes_per_rank_no_ring_factor.{op}"),)),
    )


_ATTENTION_FLOPS = Axis("attention FLOPs counted or left out", (Variant(
    "6N alone: the attention term 12 L H Q T left out (Kaplan et al. 2020's C = 6N per token)", "attention = 0",
    set={"attention": Fraction(0)}),))

_RECOMPUTED = Axis("model or hardware FLOPs (recomputation counted)", (Variant(
    "hardware FLOPs: the whole forward counted again (full recomputation, 8N + 16 L H Q T; an HFU)",
    "recompute = 1", set={"recompute": Fraction(1)}),))

_PEAK_SPARSITY = Axis("peak FLOP/s dense or with 2:4 sparsity", (
    Variant("peak read as the datasheet's figure with 2:4 structured sparsity (twice the dense peak)",
            "peak_flops x 2", scale={"peak_flops": Scale(Fraction(2))}),
    Variant("dense peak meant, the figure given with 2:4 structured sparsity (half of it)", "peak_flops / 2",
            scale={"peak_flops": Scale(Fraction(1, 2))}),
))


def _build() -> tuple[tuple[str, Axis], ...]:
    rows: list[tuple[str, Axis]] = [
        ("memory.train_state_bytes", _BYTES_PER_PARAM),
        ("memory.state_plus_activations_bytes", _BYTES_PER_PARAM),
        ("memory.state_plus_activations_bytes", _ACT_SHARDED_TP_PP),
        ("memory.min_tp_pow2", _BYTES_PER_PARAM),
        ("memory.optimizer_bytes", _OPTIMIZER),
        ("memory.weights_bytes", _WEIGHT_BYTES),
        ("memory.grads_bytes", _GRAD_BYTES),
        ("zero.bytes_per_gpu.stage*", _ZERO_K),
        ("memory.per_gpu_bytes.zero*", _ZERO_K),
        ("memory.per_gpu_bytes.zero*", _ACT_SHARDED_DP),
        ("memory.state_plus_activations_bytes", Axis("sum or maximum of the components", (Variant(
            _MAX_NOT_SUM, "memory.max_of_state_and_activations_bytes",
            quantity="memory.max_of_state_and_activations_bytes"),))),
        ("layout.dp_from_world_size", Axis("EP inside or outside DP", (Variant(
            "EP outside DP (expert-parallel ranks are extra GPUs: tp x cp x pp x dp x ep)",
            "layout.dp_from_world_size.ep_outside_dp", quantity="layout.dp_from_world_size.ep_outside_dp"),))),
        ("layout.dp_from_world_size.ep_outside_dp", Axis("EP inside or outside DP", (Variant(
            "EP inside DP (expert groups carved out of the data-parallel ranks: no extra GPUs)",
            "layout.dp_from_world_size", quantity="layout.dp_from_world_size"),))),
        ("layout.world_size.ep_inside_dp", Axis("EP inside or outside DP", (Variant(
            "EP outside DP (expert-parallel ranks are extra GPUs: tp x cp x pp x dp x ep)",
            "layout.world_size.ep_outside_dp",
            quantity="layout.world_size.ep_outside_dp"),))),
        ("layout.world_size.ep_outside_dp", Axis("EP inside or outside DP", (Variant(
            "EP inside DP (expert groups carved out of the data-parallel ranks: no extra GPUs)",
            "layout.world_size.ep_inside_dp",
            quantity="layout.world_size.ep_inside_dp"),))),
        ("activations.checkpointed_peak_bytes", Axis("what a checkpointed model stores", (Variant(
            "layer-input checkpoints only (no recompute working set)", "activations.total_bytes.full_recompute",
            quantity="activations.total_bytes.full_recompute"),))),
        ("pp.step_ticks.*", _BACKWARD),
        ("pp.busy_ticks", _BACKWARD),
        ("*", _PARAM_COUNT),
        ("zero.bytes_per_gpu.stage3_with_gather", Axis("which ZeRO-3 estimate", (Variant(
            "DeepSpeed's ZeRO-3 estimator: int(18 Psi / N) + 4 x largest_layer_params (the largest layer gathered "
            "in fp32)", "zero.bytes_per_gpu.stage3_with_gather.deepspeed_estimator",
            quantity="zero.bytes_per_gpu.stage3_with_gather.deepspeed_estimator"),))),
        ("comm.busbw.all_reduce", Axis("ring or in-network all-reduce", (Variant(
            "in-network (SHARP) all-reduce bus-bandwidth factor (n-1)/(n+1)", "comm.busbw.all_reduce.in_network",
            quantity="comm.busbw.all_reduce.in_network"),))),
        ("comm.busbw.all_reduce.in_network", Axis("ring or in-network all-reduce", (Variant(
            "ring all-reduce bus-bandwidth factor 2(n-1)/n (nccl-tests)", "comm.busbw.all_reduce",
            quantity="comm.busbw.all_reduce"),))),
    ]
    rows.append(("flops.mfu.palm", _ATTENTION_FLOPS))
    rows.append(("flops.mfu.palm", _RECOMPUTED))
    for name in ("flops.mfu", "flops.hfu", "flops.mfu.palm", "flops.utilization"):
        rows.append((name, _PEAK_SPARSITY))
    for s in range(4):
        rows.append((f"zero.bytes_per_gpu.stage{s}", _zero_precision(f"stage{s}")))
        rows.append((f"memory.per_gpu_bytes.zero{s}", Axis("sum or maximum of the components", (Variant(
            _MAX_NOT_SUM, f"memory.per_gpu_bytes_max.zero{s}", quantity=f"memory.per_gpu_bytes_max.zero{s}"),))))
    for k in ("ddp", "stage1", "stage2", "stage3"):
        rows.append((f"zero.comm_bytes_per_rank.{k}", Axis("ring factor (n-1)/n", (Variant(
            "ring factor (n-1)/n dropped (the large-n limit; the ZeRO paper counts volumes this way)",
            f"zero.comm_bytes_per_rank_no_ring_factor.{k}",
            quantity=f"zero.comm_bytes_per_rank_no_ring_factor.{k}"),))))
        # the paper's element count (2 Psi, 3 Psi) read with the ring factor: needs the claim's n
        # (a convention input of zero.comm_elements_per_rank.*); a figure in elements crosses back from
        # bytes through bytes_per_element (distcheck.audit.claim_units.UNIT_BRIDGES)
        rows.append((f"zero.comm_elements_per_rank.{k}", Axis("ring factor (n-1)/n", (Variant(
            "ring factor (n-1)/n kept (nccl-tests): (n-1)/n of the paper's count per rank, on a ring of n",
            f"zero.comm_bytes_per_rank.{k} / bytes_per_element", quantity=f"zero.comm_bytes_per_rank.{k}",
            needs=("n",)),))))
        rows.append((f"zero.comm_bytes_per_rank_no_ring_factor.{k}", Axis("ring factor (n-1)/n", (Variant(
            "with the ring factor (n-1)/n (nccl-tests)", f"zero.comm_bytes_per_rank.{k}",
            quantity=f"zero.comm_bytes_per_rank.{k}"),))))
    for sched in Schedule:
        rows.append((f"pp.bubble_fraction.{sched}", _bubble_axis(sched, "ratio")))
        rows.append((f"pp.bubble_ratio.{sched}", _bubble_axis(sched, "fraction")))
    for prefix in ("pp.bubble_ticks.1f1b", "pp.bubble_ticks.zb_h1", "pp.bubble_ticks.zb_h2.steady"):
        for own in ("b_input", "b_full"):
            rows.append((f"{prefix}.{own}", _b_axis(prefix, own)))
    for sched in (Schedule.ZB_H2, Schedule.ZB_V):
        for kind in ("bubble_ticks", "bubble_ratio"):
            rows.append((f"pp.{kind}.{sched}", _steady_axis(f"pp.{kind}.{sched}")))
    for r in _ACT_ROWS:
        rows.append((f"activations.bytes_per_layer.{r}", _act_axis("activations.bytes_per_layer", r)))
        rows.append((f"activations.total_bytes.{r}", _act_axis("activations.total_bytes", r)))
    for op in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        for axis in _comm_axes(op):
            rows.append((f"comm.bytes_per_rank.{op}", axis))
        rows.append((f"comm.bytes_per_rank_no_ring_factor.{op}", Axis("ring factor (n-1)/n", (Variant(
            "with the ring factor (n-1)/n (nccl-tests)", f"comm.bytes_per_rank.{op}",
            quantity=f"comm.bytes_per_rank.{op}"),))))
    return tuple(rows)


#: (quantity name pattern, axis): the axes a quantity's figures are tried under
CONVENTIONS: tuple[tuple[str, Axis], ...] = _build()

#: a printed unit -> the unit it is often confused with (decimal vs binary)
UNIT_ALTERNATIVES: dict[str, str] = {
    "KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB", "KiB": "KB", "MiB": "MB", "GiB": "GB", "TiB": "TB",
    "MB/s": "MiB/s", "GB/s": "GiB/s", "MiB/s": "MB/s", "GiB/s": "GB/s",
}


def _unit_axis(unit: str) -> Axis | None:
    alt = UNIT_ALTERNATIVES.get(unit)
    if alt is None:
        parts = unit.split(" ", 1)
        swap = {"K": "Ki", "M": "Mi", "B": "Gi", "T": "Ti", "Ki": "K", "Mi": "M", "Gi": "B", "Ti": "T"}
        if len(parts) == 2 and parts[0] in swap:
            alt = f"{swap[parts[0]]} {parts[1]}"
    if alt is None:
        return None
    head = alt.split(" ", 1)[0]
    size = _UNIT_SIZE.get(head) or _UNIT_SIZE.get(head + "-") or _UNIT_SIZE.get(head.removesuffix("/s"))
    if size and head.endswith("/s"):
        size += "/s"
    label = f"{unit} read as {alt}" + (f" ({size})" if size else "")
    return Axis("decimal or binary units", (Variant(label, f"the figure is in {alt}", unit=alt),))


#: the size of one unit, named in the variant ("GB read as GiB (2^30 bytes)"); "X-" is a count prefix
_UNIT_SIZE = {"KB": "1e3 bytes", "MB": "1e6 bytes", "GB": "1e9 bytes", "TB": "1e12 bytes",
              "KiB": "2^10 bytes", "MiB": "2^20 bytes", "GiB": "2^30 bytes", "TiB": "2^40 bytes",
              "K-": "1e3", "M-": "1e6", "B-": "1e9", "T-": "1e12", "Ki-": "2^10", "Mi-": "2^20", "Gi-": "2^30",
              "Ti-": "2^40"}


def axes_for(quantity: str, unit: str, inputs: Mapping[str, object]) -> list[Axis]:
    """The axes to try for a claim on ``quantity`` printed in ``unit`` with ``inputs``
    (the names the claim gave, ``model`` included). Variants whose ``needs`` are not
    all present are dropped; empty axes are dropped. Raises ConfigError for arguments of
    the wrong type."""
    check_type("quantity", quantity, str, "must be a quantity name (a str)")
    check_type("unit", unit, str, "must be a unit name (a str)")
    check_type("inputs", inputs, Mapping, "must map input names to values")
    out: list[Axis] = []
    for pattern, axis in CONVENTIONS:
        if fnmatch.fnmatchcase(quantity, pattern):
            keep = tuple(v for v in axis.variants if all(n in inputs for n in v.needs))
            if keep:
                out.append(Axis(axis.name, keep))
    u = _unit_axis(unit)
    if u is not None:
        out.append(u)
    return out


def apply_variant(variant: Variant, quantity: str, values: dict, unit: str, *, model: str | None,
                  form_value: Callable[[str], int | Fraction], nominal: Callable[[str], int | Fraction | None],
                  input_names: Callable[[str], dict[str, Fraction | None] | None],
                  optional: frozenset[str] = frozenset()) -> tuple[str, dict, str] | None:
    """Apply ``variant`` to (quantity, exact input values, unit); None when it does not
    apply (an input it sets is not an input of the quantity, or a value is missing).
    ``optional`` names values the claim gave as convention inputs
    (``Quantity.convention_inputs``): the quantity read keeps those it takes and drops the
    others, where any other input it does not take makes the variant not apply.

    ``form_value(name)`` evaluates a closed form without inputs; ``nominal(model)``
    gives the nominal parameter count; ``input_names(quantity)`` lists the inputs
    and their defaults as a dict.
    """
    q = variant.quantity or quantity
    names = input_names(q)
    if names is None:
        return None
    new = {k: v for k, v in values.items() if k in names}
    if set(values) - set(names) - optional:
        return None  # the replacement quantity does not take an input the claim gave
    for k, spec in variant.set.items():
        if k not in names:
            return None
        v: int | Fraction | None
        if isinstance(spec, FormValue):
            v = form_value(spec.name)
        elif isinstance(spec, _NominalParams):  # NOMINAL_PARAMS, the one instance
            v = nominal(model) if model else None
        elif isinstance(spec, InputValue):
            v = new.get(spec.name, names.get(spec.name))
        else:
            v = spec
        if v is None:
            return None
        current = new.get(k, names.get(k))
        if current is not None and Fraction(current) == Fraction(v):
            return None  # not a change: the claim already reads it this way
        new[k] = Fraction(v)
    for k, sc in variant.scale.items():
        base = new.get(k, names.get(k))
        factors = [new.get(b, names.get(b)) for b in sc.by]
        present = [f for f in factors if f is not None]
        if base is None or len(present) != len(factors):
            return None
        mult = sc.factor
        for f in present:
            mult *= Fraction(f)
        if mult == 1:
            return None  # no change
        new[k] = Fraction(base) / mult if sc.invert else Fraction(base) * mult
    return q, new, variant.unit or unit


def describe_conventions() -> list[dict]:
    """The convention table (pattern, axis, variant names and descriptions) for docs and --list."""
    return [
        {"quantity": pattern, "axis": axis.name,
         "variants": [{"name": v.name, "description": v.description} for v in axis.variants]}
        for pattern, axis in CONVENTIONS
    ]
