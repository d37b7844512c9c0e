"""Per-GPU memory, pipeline bubble and communication of one parallel layout, exactly.

Every quantity is an exact ``int`` or :class:`fractions.Fraction` in bytes
(GB = 1e9 bytes, GiB = 2**30 bytes), computed from distcheck's references and
closed forms under the conventions named below. :data:`CONVENTIONS` holds the
same text the command line prints, so a reader of a plan sees what was assumed.

Training state per GPU (weights, gradients, optimizer state)
    ``bytes_per_param`` convention of :data:`distcheck.parallel.memory.CONVENTIONS`
    (default ``mixed_adamw``: 2 + 2 + 12 = 16 bytes per parameter; the
    lesson "Scaling and distributed training", section 1, and the ZeRO paper,
    Rajbhandari et al. 2020, section 3.1). Tensor and pipeline parallelism
    split the P parameters evenly, ``P / (tp * pp)`` per GPU (the lesson's
    "Memory per GPU"; real first and last stages also hold the embedding and
    the head). ZeRO then shards over the ``N = dp * cp`` ranks that hold the
    same weights: stage 1 the optimizer state, stage 2 also the gradients,
    stage 3 also the weights (ZeRO paper, Figure 1; with the 2-byte weights
    and gradients of ``mixed_adamw`` the sum equals the catalogue's
    ``zero.bytes_per_gpu.stage0..3`` at ``params = P / (tp * pp)``).

Activations per GPU
    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", Table 2 (``activations.bytes_per_layer.*``): the row
    for the recompute mode (none, selective, full) with tensor parallelism,
    and with sequence parallelism when it is on, evaluated at
    ``s = seq_len / cp``, ``b`` = micro-batch size, ``h`` = hidden size,
    ``a`` = heads, ``t = tp``. Table 2 has no row for full recompute with
    sequence parallelism; there the layer input alone, split by t, is kept
    (``distcheck.parallel.activations.bytes_per_layer(..., sequence_parallel=True,
    recompute="full")`` = ``2 s b h / t``). Table 2's layer is GPT's
    (multi-head attention, a two-matrix MLP of width 4h): for SwiGLU or
    grouped-query models it is an estimate. A stage holds ``num_layers / pp``
    layers for each micro-batch in flight: ``pp.peak_in_flight.<schedule>``
    (1F1B: ``min(pp, m)``, so the first stage holds a whole model's layers,
    as in Korthikanti et al. 2022 section 4.2.3; GPipe: ``m``). Embedding,
    logits and temporary buffers are not counted, except context parallelism's: with cp > 1, one
    layer's all-gathered K and V of the whole sequence (``cp.all_gather.buffer_bytes_per_rank``,
    Llama 3 §3.3.2: ``2 seq_len b (num_kv_heads / tp) head_dim`` elements), held while that layer's
    attention runs.

Pipeline bubble
    ``pp.bubble_fraction.<schedule>`` (idle / total time; GPipe and 1F1B:
    ``(pp - 1) / (m + pp - 1)``; Huang et al. 2019, Narayanan et al. 2021
    section 2.2).

Communication: bytes each GPU sends per training step (m micro-batches)
    Collectives are rings, ``comm.bytes_per_rank.*`` (nccl-tests
    doc/PERFORMANCE.md: all-reduce ``2 (n-1)/n S``, all-gather and
    reduce-scatter ``(n-1)/n S``, S the full tensor). Activations travel in 2 bytes.

    * tp: ``tp.comm_bytes_per_layer`` (Narayanan et al. 2021 section 3.2:
      ``8 b s h (t-1)/t`` elements per layer per micro-batch, forward and
      backward; sequence parallelism moves the same bytes as an all-gather
      plus a reduce-scatter) for each of the stage's layers and micro-batches;
    * pp: ``b s h`` elements per micro-batch between consecutive stages in each
      direction (Narayanan et al. 2021 section 3.2), ``/ tp`` with sequence
      parallelism (each rank sends its sequence shard); the busiest stage sends
      both ways (one way when pp = 2);
    * cp: all-gather-based context parallelism (Llama 3 paper, Dubey et al.
      2024, section 3.3.2): K and V of the local heads (``num_kv_heads / tp``)
      are all-gathered over cp ranks in each layer's forward, and the adjoint,
      a reduce-scatter of their gradients, runs in the backward
      (``cp.all_gather.bytes_per_rank.forward`` + ``.backward``, :mod:`distcheck.parallel.cp`);
    * dp: gradients synchronised once per step over the ``N = dp * cp`` ranks,
      in the convention's gradient bytes: ZeRO-0 an all-reduce, ZeRO-1/2 a
      reduce-scatter plus an all-gather of the updated weights (the ZeRO
      paper's 2 Psi, section 7); ZeRO-3 all-gathers the weights for each
      micro-batch's forward and backward (FSDP's reshard after forward) and
      reduce-scatters the gradients once (with m = 1, the paper's 3 Psi).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Collective
from distcheck.parallel import layout as layout_ref
from distcheck.plan.inputs import (
    ACTIVATION_BYTES,
    Hardware,
    Layout,
    Workload,
    _exact,
)
from distcheck.plan.model import ModelSpec
from distcheck.plan.timeforms import TIME_FORMS

__all__ = [
    "Estimate",
    "check_layout",
    "check_model_rules",
    "cp_kv_buffer",
    "estimate",
    "conventions",
]

@dataclass(frozen=True)
class Estimate:
    """Everything the planner computes for one layout (exact bytes; None where the model has no shape).

    Attributes:
        layout, hardware: what was sized.
        params_per_gpu: ``P / (tp * pp)``.
        weights, gradients, optimizer: training-state bytes per GPU after ZeRO sharding.
        activations: activation bytes per GPU (None without a model shape): the stored layers', and with
            cp > 1 one layer's all-gathered K and V (:func:`cp_kv_buffer`).
        activations_per_layer: bytes of one layer for one micro-batch (Table 2 row).
        layers_per_stage: ``num_layers / pp`` (None without a shape).
        in_flight: micro-batches whose activations a stage holds at once.
        bubble_fraction: idle / total time of the pipeline schedule.
        comm: bytes each GPU sends per step, by axis (tp, pp, cp, dp); None where
            it needs the model shape.
    """

    layout: Layout
    hardware: Hardware
    params_per_gpu: int | Fraction
    weights: int | Fraction
    gradients: int | Fraction
    optimizer: int | Fraction
    activations: int | Fraction | None
    activations_per_layer: int | Fraction | None
    layers_per_stage: int | None
    in_flight: int
    bubble_fraction: int | Fraction
    comm: dict[str, int | Fraction | None] = field(default_factory=dict)

    @property
    def state(self) -> int | Fraction:
        """Weights + gradients + optimizer state per GPU (the lesson's "before activations")."""
        return _exact(Fraction(self.weights) + Fraction(self.gradients) + Fraction(self.optimizer))

    @property
    def total(self) -> int | Fraction:
        """State + activations per GPU (activations count 0 when unknown)."""
        return _exact(Fraction(self.state) + Fraction(self.activations or 0))

    @property
    def parts(self) -> dict[str, int | Fraction]:
        """The four components of :data:`COMPONENTS` (activations 0 when unknown); they sum to :attr:`total`."""
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations or 0}

    @property
    def fits(self) -> bool:
        """``total <= hardware.usable_bytes``."""
        return self.total <= self.hardware.usable_bytes

    @property
    def fits_before_activations(self) -> bool:
        return self.state <= self.hardware.usable_bytes

    @property
    def comm_total(self) -> int | Fraction:
        """The sum of the known parts of :attr:`comm`."""
        return _exact(sum((Fraction(v) for v in self.comm.values() if v is not None), Fraction(0)))

    @property
    def comm_complete(self) -> bool:
        return all(v is not None for v in self.comm.values())

    @property
    def memory_fraction(self) -> Fraction:
        """``total / gpu_memory`` (not of the usable part: the reserve shows as headroom)."""
        return Fraction(self.total) / Fraction(self.hardware.gpu_memory)


def _divides(a: int, b: int) -> bool:
    return b % a == 0


def check_model_rules(model: ModelSpec, workload: Workload, tp: int, pp: int, cp: int) -> None:
    """Raise ConfigError unless the degrees suit the model and the sequence.

    ``cp`` divides ``seq_len`` (each rank gets ``seq_len / cp`` tokens); with a
    model shape, ``tp`` divides ``num_heads``, ``num_kv_heads`` and
    ``ffn_hidden_size`` (attention splits by heads, the MLP by columns) and
    ``pp`` divides ``num_layers`` (whole layers per stage).
    """
    shape = model.config
    if shape is not None:
        for name in ("num_heads", "num_kv_heads", "ffn_hidden_size"):
            if not _divides(tp, getattr(shape, name)):
                raise ConfigError("tp", tp, f"must divide {name}={getattr(shape, name)}")
        if not _divides(pp, shape.num_layers):
            raise ConfigError("pp", pp, f"must divide num_layers={shape.num_layers} (whole layers per stage)")
    if not _divides(cp, workload.seq_len):
        raise ConfigError("cp", cp, f"must divide seq_len={workload.seq_len}")


def check_layout(model: ModelSpec, hardware: Hardware, workload: Workload, layout: Layout, *,
                 tp_within_node: bool = True) -> None:
    """Raise ConfigError unless ``layout`` can run ``model`` on ``hardware``.

    Rules: those of :func:`check_model_rules`; ``tp * cp * pp * dp == gpus``;
    each tensor-parallel group inside one node
    (:func:`distcheck.parallel.layout.tp_groups_node_local`, default order tp, cp, pp,
    dp innermost first), unless ``tp_within_node`` is False (``plan time`` sizes the layouts whose
    tensor parallelism crosses nodes too, to show what that costs).
    """
    check_model_rules(model, workload, layout.tp, layout.pp, layout.cp)
    if layout.world_size != hardware.gpus:
        raise ConfigError("gpus", hardware.gpus, f"must equal tp*cp*pp*dp = {layout.tp}*{layout.cp}*{layout.pp}*"
                                                 f"{layout.dp} = {layout.world_size}")
    cfg = layout_ref.ParallelConfig(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp,
                                    gpus_per_node=hardware.gpus_per_node)
    if tp_within_node and not layout_ref.tp_groups_node_local(cfg):
        raise ConfigError("tp", layout.tp, f"must divide gpus_per_node={hardware.gpus_per_node} "
                                           "(tensor parallelism stays inside a node)")


# ----------------------------------------------------------------------------------------------
# closed forms, evaluated once per distinct input, in exact Fractions without sympy
#
# Every form the planner evaluates has an exact sympy-free evaluator below, keyed by its catalogue name and
# taking the same inputs: the project's exact references where there is one (nccl-tests' factors,
# :func:`distcheck.parallel.comm.ideal.volume`; Table 2, :func:`distcheck.parallel.activations.table2_bytes_per_layer`),
# else the form's own expression in Fractions. Loading sympy and the catalogue takes seconds of CPU, the whole
# plan well under one; tests/plan/test_plan_forms_exact.py holds each evaluator equal to the catalogue's form on
# drawn inputs. A name without an evaluator is evaluated by the catalogue.


def _volume(collective: str, size_bytes: int | Fraction, n: int | Fraction) -> Fraction:
    from distcheck.parallel.comm.ideal import volume

    return volume(collective, Fraction(size_bytes), int(n))


def _table2(row: str, s: int | Fraction, b: int | Fraction, h: int | Fraction, a: int | Fraction,
            t: int | Fraction) -> int | Fraction:
    from distcheck.parallel.activations.reference import table2_bytes_per_layer

    return table2_bytes_per_layer(row, int(s), int(b), int(h), int(a), int(t))


def _tp_comm_bytes(s: int, b: int, h: int, t: int, bytes_per_element: int | Fraction) -> Fraction:
    # Narayanan et al. 2021 section 3.2: 8bsh(t-1)/t elements per layer per micro-batch, forward + backward
    return Fraction(bytes_per_element) * Fraction(8 * b * s * h * (t - 1), t)


def _cp_all_gather_bytes(s: int, b: int, num_kv_heads: int, head_dim: int, bytes_per_element: int, cp: int) -> Fraction:
    # Llama 3 section 3.3.2, nccl-tests' factor: all-gathers of K and V (forward) or reduce-scatters of dK, dV
    # (backward) of the whole sequence, (cp-1)/cp of S = s b Hkv e B each
    return Fraction(2 * (cp - 1) * s * b * num_kv_heads * head_dim * bytes_per_element, cp)


def _cp_all_gather_buffer(s: int, b: int, num_kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    return 2 * s * b * num_kv_heads * head_dim * bytes_per_element  # the gathered K and V of the whole sequence


def _bubble_fraction(p: int, m: int, t_f: int = 1,
                     t_b: int = 2) -> Fraction:  # GPipe and 1F1B: (p - 1) / (m + p - 1), any t_f, t_b
    return Fraction(p - 1, m + p - 1)


def _moe_params(vocab_size: int, h: int, num_layers: int, dense_layers: int, attention_params: int, mlp_matrices: int,
                expert_ffn: int, dense_ffn: int, num_experts: int, shared_experts: int, tied: int,
                k: int | None = None) -> int:  # ep.params.total; with k, ep.params.active
    experts = num_experts if k is None else k
    return (vocab_size * h * (2 - tied) + h + num_layers * (attention_params + 2 * h)
            + dense_layers * mlp_matrices * h * dense_ffn
            + (num_layers - dense_layers)
            * (h * num_experts + (experts + shared_experts) * mlp_matrices * h * expert_ffn))


def _moe_bytes(dense_params: int, expert_params: int, tp: int, ep: int,
               bytes_per_parameter: int | Fraction) -> Fraction:  # ep.memory.bytes_per_gpu
    return (Fraction(dense_params, tp) + Fraction(expert_params, ep * tp)) * bytes_per_parameter


EXACT_FORMS: dict[str, Callable[..., int | Fraction]] = {
    **{f"comm.bytes_per_rank.{c.value}": functools.partial(_volume, c.value)
       for c in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)},
    **{f"activations.bytes_per_layer.{row}": functools.partial(_table2, row)
       for row in ("tp", "tp_sp", "tp_selective", "tp_sp_selective", "full_recompute")},
    "tp.comm_bytes_per_layer": _tp_comm_bytes,
    "cp.all_gather.bytes_per_rank.forward": _cp_all_gather_bytes,
    "cp.all_gather.bytes_per_rank.backward": _cp_all_gather_bytes,
    "cp.all_gather.buffer_bytes_per_rank": _cp_all_gather_buffer,
    "ep.params.total": _moe_params,
    "ep.params.active": _moe_params,
    "ep.memory.bytes_per_gpu": _moe_bytes,
    "pp.bubble_fraction.gpipe": _bubble_fraction,
    "pp.bubble_fraction.1f1b": _bubble_fraction,
    "pp.peak_in_flight.gpipe": lambda p, m, t_f=1, t_b=2: m,
    "pp.peak_in_flight.1f1b": lambda p, m, t_f=1, t_b=2: min(p, m),
    **TIME_FORMS,
}


@functools.cache
def _form_value(name: str, items: tuple[tuple[str, int | Fraction], ...]) -> int | Fraction:
    exact = EXACT_FORMS.get(name)
    if exact is not None:
        return _exact(Fraction(exact(**dict(items))))
    from distcheck.closed_form import get

    return get(name).evaluate(**dict(items))


def form(name: str, **inputs: int | Fraction) -> int | Fraction:
    """The value of catalogue form ``name`` (``distcheck.closed_form.get(name).evaluate(**inputs)``), exact,
    cached on the inputs; computed without sympy for the forms of :data:`EXACT_FORMS`."""
    return _form_value(name, tuple(sorted(inputs.items())))


def _collective(name: str, size_bytes: int | Fraction, n: int) -> int | Fraction:
    """Bytes one rank sends in collective ``name`` on ``n`` ranks over a full tensor of ``size_bytes``.

    ``comm.bytes_per_rank.<name>`` is linear in S and takes a whole number of
    bytes, so it is evaluated at S = 1 and scaled exactly (S may be a Fraction
    when tp * pp does not divide P).
    """
    if n == 1 or size_bytes == 0:
        return 0
    return _exact(Fraction(form(f"comm.bytes_per_rank.{name}", size_bytes=1, n=n)) * Fraction(size_bytes))


_TABLE2_ROW = {  # (recompute, sequence_parallel) -> catalogue row of Korthikanti et al. 2022 Table 2
    ("none", False): "tp", ("none", True): "tp_sp",
    ("selective", False): "tp_selective", ("selective", True): "tp_sp_selective",
    ("full", False): "full_recompute",
}


def activation_bytes_per_layer(model: ModelSpec, workload: Workload, tp: int, cp: int) -> int | Fraction:
    """Activation bytes of one layer for one micro-batch on one GPU (module docstring, "Activations")."""
    shape = model.config
    if shape is None:
        raise ConfigError("model", model.name, "has no shape: activations need the hidden size, heads and layers")
    s, b, h, a = workload.seq_len // cp, workload.micro_batch_size, shape.hidden_size, shape.num_heads
    row = _TABLE2_ROW.get((workload.recompute, workload.sequence_parallel))
    if row is None:  # full recompute with sequence parallelism: the layer input split by t (no Table 2 row)
        from distcheck.parallel import activations

        return activations.bytes_per_layer(s, b, h, a, tp, sequence_parallel=True, recompute="full")
    return form(f"activations.bytes_per_layer.{row}", s=s, b=b, h=h, a=a, t=tp)


def _cp_inputs(model: ModelSpec, workload: Workload, tp: int) -> dict[str, int]:
    """The inputs of the cp forms (:mod:`distcheck.parallel.cp`) for one tensor-parallel rank: the whole
    sequence, the micro-batch, its ``num_kv_heads / tp`` KV heads, the head dimension, 2-byte activations."""
    shape = model.config
    assert shape is not None and shape.num_kv_heads is not None and shape.head_dim is not None, \
        "TransformerConfig.__post_init__ sets both"
    return {"s": workload.seq_len, "b": workload.micro_batch_size, "num_kv_heads": shape.num_kv_heads // tp,
            "head_dim": shape.head_dim, "bytes_per_element": ACTIVATION_BYTES}


def cp_kv_buffer(model: ModelSpec, workload: Workload, tp: int, cp: int) -> int | Fraction:
    """Bytes of the K and V a context-parallel rank all-gathers for one layer's attention (0 at cp = 1):
    ``cp.all_gather.buffer_bytes_per_rank`` (Llama 3 §3.3.2) at the whole sequence and ``num_kv_heads / tp``
    KV heads, 2-byte activations. One layer's at a time: it is freed when the layer's attention is done."""
    return 0 if cp == 1 else form("cp.all_gather.buffer_bytes_per_rank", **_cp_inputs(model, workload, tp))


def _comm(model: ModelSpec, workload: Workload, lay: Layout, psi: Fraction) -> dict[str, int | Fraction | None]:
    conv = workload.convention
    m, b = workload.num_microbatches, workload.micro_batch_size
    s_local = workload.seq_len // lay.cp
    shape = model.config
    out: dict[str, int | Fraction | None] = {}
    if shape is None:
        out["tp"] = 0 if lay.tp == 1 else None
        out["pp"] = 0 if lay.pp == 1 else None
        out["cp"] = 0 if lay.cp == 1 else None
    else:
        h, layers = shape.hidden_size, shape.num_layers // lay.pp
        out["tp"] = 0 if lay.tp == 1 else _exact(
            Fraction(form("tp.comm_bytes_per_layer", s=s_local, b=b, h=h, t=lay.tp, bytes_per_element=ACTIVATION_BYTES))
            * layers * m)
        sends = 0 if lay.pp == 1 else 1 if lay.pp == 2 else 2
        boundary = Fraction(b * s_local * h * ACTIVATION_BYTES, lay.tp if workload.sequence_parallel else 1)
        out["pp"] = _exact(sends * m * boundary)
        kv = _cp_inputs(model, workload, lay.tp)
        out["cp"] = 0 if lay.cp == 1 else _exact(
            (Fraction(form("cp.all_gather.bytes_per_rank.forward", cp=lay.cp, **kv))
             + Fraction(form("cp.all_gather.bytes_per_rank.backward", cp=lay.cp, **kv))) * layers * m)
    n = lay.shard_ranks
    grads, weights = conv.grads * psi, conv.weights * psi
    if lay.zero == 0:
        dp = Fraction(_collective(Collective.ALL_REDUCE, grads, n))
    elif lay.zero in (1, 2):
        dp = (Fraction(_collective(Collective.REDUCE_SCATTER, grads, n))
              + Fraction(_collective(Collective.ALL_GATHER, weights, n)))
    else:
        dp = (2 * m * Fraction(_collective(Collective.ALL_GATHER, weights, n))
              + Fraction(_collective(Collective.REDUCE_SCATTER, grads, n)))
    out["dp"] = _exact(dp)
    return out


def estimate(model: ModelSpec, hardware: Hardware, workload: Workload, layout: Layout, *,
             tp_within_node: bool = True) -> Estimate:
    """Memory per GPU, bubble and communication of ``layout`` (module docstring for the conventions).

    Raises ConfigError when the layout is not valid (:func:`check_layout`, with ``tp_within_node``).
    """
    check_layout(model, hardware, workload, layout, tp_within_node=tp_within_node)
    conv = workload.convention
    psi = Fraction(model.params, layout.tp * layout.pp)
    n = layout.shard_ranks

    def sharded(bytes_per_param: int, from_stage: int) -> int | Fraction:
        total = bytes_per_param * psi
        return _exact(total / n if layout.zero >= from_stage else total)

    m = workload.num_microbatches
    in_flight = form(f"pp.peak_in_flight.{workload.schedule}", p=layout.pp, m=m)
    if model.config is None:
        per_layer = acts = layers = None
    else:
        layers = model.config.num_layers // layout.pp
        per_layer = activation_bytes_per_layer(model, workload, layout.tp, layout.cp)
        acts = _exact(Fraction(per_layer) * layers * in_flight
                      + Fraction(cp_kv_buffer(model, workload, layout.tp, layout.cp)))
    return Estimate(
        layout=layout,
        hardware=hardware,
        params_per_gpu=_exact(psi),
        weights=sharded(conv.weights, 3),
        gradients=sharded(conv.grads, 2),
        optimizer=sharded(conv.optimizer, 1),
        activations=acts,
        activations_per_layer=per_layer,
        layers_per_stage=layers,
        in_flight=int(in_flight),
        bubble_fraction=form(f"pp.bubble_fraction.{workload.schedule}", p=layout.pp, m=m),
        comm=_comm(model, workload, layout, psi),
    )


def conventions(model: ModelSpec, workload: Workload) -> list[str]:
    """The conventions a plan uses, one line each, as printed with every plan."""
    conv = workload.convention
    row = _TABLE2_ROW.get((workload.recompute, workload.sequence_parallel), "layer input / t (no Table 2 row)")
    lines = [
        f"bytes per parameter: {workload.bytes_per_param} = {conv.weights} weights + {conv.grads} gradients + "
        f"{conv.optimizer} optimizer = {conv.total} B/param ({conv.source})",
        "state split evenly over tp × pp; ZeRO shards over dp × cp (ZeRO paper, Figure 1)",
    ]
    if model.has_shape:
        lines.append(
            f"activations: Korthikanti et al. 2022 Table 2, row {row} (recompute {workload.recompute}, sequence "
            f"parallel {'on' if workload.sequence_parallel else 'off'}), s = seq_len / cp, GPT layer (4h MLP) as an "
            f"estimate for this model; × layers per stage × pp.peak_in_flight.{workload.schedule}; with cp > 1, + one "
            "layer's all-gathered K and V (cp.all_gather.buffer_bytes_per_rank)")
    else:
        lines.append("activations: not counted (a raw parameter count has no shape; give --model or the shape)")
    lines += [
        f"bubble: pp.bubble_fraction.{workload.schedule} (idle / total) at m = {workload.num_microbatches}",
        "communication: bytes each GPU sends per step, ring collectives (comm.bytes_per_rank.*); tp: "
        "tp.comm_bytes_per_layer; pp: b·s·h per micro-batch each way (/ tp with sequence parallel); cp: all-gather "
        "of K, V and reduce-scatter of their gradients (cp.all_gather.bytes_per_rank.*); dp: all-reduce (ZeRO-0), "
        "reduce-scatter + all-gather "
        "(ZeRO-1/2), all-gather per micro-batch forward and backward + reduce-scatter (ZeRO-3)",
        "GB = 1e9 bytes",
    ]
    return lines
