"""The time of one training step of a layout, term by term, from stated hardware and sourced forms.

Every figure is an exact Fraction of seconds (FLOP/s, bytes and bytes/s in, as
:mod:`distcheck.plan.hardware` holds them). A step runs ``m`` micro-batches of ``b`` sequences of
``s`` tokens on each of the ``dp`` replicas: a fixed global batch ``B = dp m b`` sequences, so the
layouts a plan compares do the same work per step, and ``m = B / (dp b)`` differs between them.

Compute
    Hardware FLOPs per token, ``flops.hardware_per_token.<recompute>`` (``flops.model_per_token``
    without recomputation; :mod:`distcheck.parallel.flops`), split evenly over the ``tp cp pp`` GPUs of
    a replica (the head and the embedding on the last and first stages are not placed), run at
    ``efficiency x peak_flops`` (``flops.compute_time_s``): ``t_c`` per micro-batch on one GPU. The
    achievable fraction is an assumption (default :data:`DEFAULT_EFFICIENCY`), not a measurement.

Communication (each axis from the bytes of :mod:`distcheck.plan.estimate`, as collectives)
    Each collective is timed by ``comm.time_s.ring.<op>``: NCCL's latencies per collective and per
    ring step, plus the bytes each rank sends (nccl-tests' bus-bandwidth factor x S) over the bus
    bandwidth of the group's links. A group inside one node gets half the datasheet's NVLink figure
    (one direction); a group that spans nodes gets ``min(intra, g x inter_node_bandwidth)``, ``g`` its
    fewest ranks in one node (each GPU has its own NIC and NCCL runs a ring per NIC, so g ranks of a
    node send over g NICs at once), and its ring steps across nodes pay the network latency. Ranks
    are placed in the order tp, cp, pp, dp, innermost first (Llama 3 §3.3.2), nodes filled in order.

    * tp: per layer and micro-batch, 4 all-reduces of ``b s h`` 2-byte activations (2 forward, 2
      backward; Narayanan et al. 2021 §3.2), or with sequence parallelism 4 all-gathers and 4
      reduce-scatters of the same tensors (the same bytes); full recomputation runs the forward's
      again (x 3/2);
    * cp: per layer and micro-batch, an all-gather of K and V forward and a reduce-scatter of their
      gradients backward (Llama 3 §3.3.2; the forward's again under full recomputation);
    * pp: per micro-batch, the busiest stage sends its boundary activations forward and gradients
      backward, ``b s h / tp`` (sequence parallel) 2-byte elements each, ``comm.time_s.send_recv``;
    * dp: once per step over the ``dp cp`` ranks that hold the same weights, the gradients (ZeRO-0 an
      all-reduce; ZeRO-1/2/3 a reduce-scatter), ZeRO-1/2's all-gather of the updated weights after the
      optimizer step, and ZeRO-3's all-gather of each layer's weights for every micro-batch's forward
      and backward (FSDP), each sent as one message per layer (ZeRO-3) or per step (the others: bucketing
      adds a latency per bucket).

Overlap (named, overridable: :data:`OVERLAP_MODES`, defaults :data:`DEFAULT_OVERLAP`)
    ``none``: the axis' time is all exposed. ``compute``: it runs beside the micro-batch's compute, and
    only what exceeds ``t_c`` is exposed. ``backward``: the gradient reduction runs beside the last
    micro-batch's backward (its share of ``t_c``: hardware less forward FLOPs). Defaults: tp, cp and
    pp none (they sit between dependent layers: "TP none unless asked"), dp backward (DDP's buckets
    reduce while the backward runs), fsdp compute (ZeRO-3's gathers are prefetched; the FSDP paper,
    Zhao et al. 2023, §3.3). ZeRO-1/2's gather after the optimizer step is always exposed.

Pipeline bubble
    The stage's per-micro-batch time ``t_mb = t_c + exposed(tp, cp, pp, fsdp)``, ``m`` of them busy,
    stretched by the simulator's ``step_ticks / busy_ticks`` for the chosen schedule
    (:func:`distcheck.parallel.pp.simulate`; 1F1B and GPipe: ``(m + p - 1) / m``).

Step
    ``step = m t_mb x step_ticks / busy_ticks + exposed dp``; its terms: compute ``m t_c``, tp, cp, pp,
    dp (exposed), bubble. Tokens per second ``B s / step`` (``flops.tokens_per_second``); MFU and HFU
    with model and hardware FLOPs per token (``flops.mfu``, ``flops.hfu``, PaLM Appendix B).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Collective
from distcheck.parallel import flops as flops_ref
from distcheck.plan.estimate import ACTIVATION_BYTES, Estimate, Hardware, Layout, Workload, estimate, form
from distcheck.plan.hardware import Accelerator
from distcheck.plan.model import ModelSpec

__all__ = ["OVERLAP_MODES", "DEFAULT_OVERLAP", "DEFAULT_EFFICIENCY", "TERMS", "Assumptions", "Placement",
           "AxisTime", "StepTime", "placement", "step_time", "parse_overlap"]

#: overlap modes each axis may take (module doc); ``fsdp`` is ZeRO-3's weight gathers
OVERLAP_MODES: dict[str, tuple[str, ...]] = {
    "tp": ("none", "compute"), "cp": ("none", "compute"), "pp": ("none", "compute"),
    "dp": ("none", "backward"), "fsdp": ("none", "compute"),
}
#: the assumed overlap of each axis (module doc)
DEFAULT_OVERLAP: dict[str, str] = {"tp": "none", "cp": "none", "pp": "none", "dp": "backward", "fsdp": "compute"}
#: the assumed achievable fraction of the peak FLOP/s (not a measurement: override it with yours)
DEFAULT_EFFICIENCY = Fraction(3, 5)
#: the terms of a step, bottom to top in the figure
TERMS = ("compute", "tp", "cp", "pp", "dp", "bubble")
#: mesh order of the placement, innermost first (Llama 3 §3.3.2)
_ORDER = ("tp", "cp", "pp", "dp")


def parse_overlap(items: Any) -> dict[str, str]:
    """``["tp=compute", "dp=none"]`` (or a mapping) over :data:`DEFAULT_OVERLAP`. Raises ConfigError naming
    ``--overlap`` for an item without ``=``, an unknown axis or a mode the axis does not take."""
    out = dict(DEFAULT_OVERLAP)
    pairs = items.items() if isinstance(items, Mapping) else [str(i).partition("=")[::2] for i in items or ()]
    for axis, mode in pairs:
        axis, mode = str(axis).strip(), str(mode).strip()
        if axis not in OVERLAP_MODES:
            raise ConfigError("--overlap", axis, f"must name an axis: {', '.join(OVERLAP_MODES)} (AXIS=MODE)")
        if mode not in OVERLAP_MODES[axis]:
            raise ConfigError("--overlap", f"{axis}={mode}", f"must be one of {', '.join(OVERLAP_MODES[axis])} for "
                                                              f"{axis}")
        out[axis] = mode
    return out


@dataclass(frozen=True)
class Assumptions:
    """What the step-time model assumes: ``efficiency`` (0 < x <= 1, the achievable fraction of the peak) and
    ``overlap`` (axis -> mode, :func:`parse_overlap`). Raises ConfigError naming the field."""

    efficiency: Fraction = DEFAULT_EFFICIENCY
    overlap: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_OVERLAP))

    def __post_init__(self) -> None:
        eff = self.efficiency
        if isinstance(eff, bool) or not isinstance(eff, (int, Fraction)) or not 0 < eff <= 1:
            raise ConfigError("efficiency", eff, "must be a fraction of the peak, 0 < efficiency <= 1")
        object.__setattr__(self, "overlap", parse_overlap(self.overlap))


@dataclass(frozen=True)
class Placement:
    """Where the groups of one axis (or of several, taken together) sit: ``nodes``, the most nodes one group
    spans; ``per_node``, the fewest ranks of one group in one of its nodes. ``crosses`` when nodes > 1."""

    nodes: int
    per_node: int

    @property
    def crosses(self) -> bool:
        return self.nodes > 1


@functools.cache
def placement(layout: Layout, gpus_per_node: int, axes: tuple[str, ...]) -> Placement:
    """The :class:`Placement` of the groups of ``axes`` (ranks that differ only along them) of ``layout``,
    order tp, cp, pp, dp innermost first, ``gpus_per_node`` ranks per node in rank order.

    A group is ``base + G0``, G0 the sums of ``k_a stride_a`` over the axes; only ``base mod gpus_per_node``
    changes how a group meets node boundaries, so one group per residue is examined."""
    degree = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp": layout.dp}
    stride, s = {}, 1
    for a in _ORDER:
        stride[a] = s
        s *= degree[a]
    g0 = np.zeros(1, dtype=np.int64)
    for a in axes:
        g0 = (g0[:, None] + np.arange(degree[a], dtype=np.int64)[None, :] * stride[a]).ravel()
    residues = {0}
    for a in _ORDER:
        if a not in axes:
            residues = {(r + k * stride[a]) % gpus_per_node for r in residues for k in range(degree[a])}
    nodes, per_node = 1, len(g0)
    for r in sorted(residues):
        _, counts = np.unique((g0 + r) // gpus_per_node, return_counts=True)
        nodes, per_node = max(nodes, len(counts)), min(per_node, int(counts.min()))
    return Placement(nodes, per_node)


@dataclass(frozen=True)
class AxisTime:
    """One axis' communication in a step: ``seconds`` (all of it, per step), ``exposed`` (after its overlap),
    ``bytes`` (each GPU sends per step), ``collectives`` (per step), ``placement``, ``busbw`` (bytes/s of its
    links), ``overlap`` (the mode assumed)."""

    seconds: Fraction
    exposed: Fraction
    bytes: Fraction
    collectives: int
    placement: Placement
    busbw: Fraction
    overlap: str


@dataclass(frozen=True)
class StepTime:
    """The step time of one layout and its terms (module doc). ``terms`` maps :data:`TERMS` to exposed seconds
    and sums to ``seconds``; ``axes`` the communication of each axis of degree > 1 (``fsdp`` for ZeRO-3's
    gathers); ``estimate`` the layout's memory plan at its ``m``."""

    estimate: Estimate
    num_microbatches: int
    tokens_per_step: int
    model_flops_per_token: Fraction
    hardware_flops_per_token: Fraction
    terms: dict[str, Fraction]
    axes: dict[str, AxisTime]
    busy_ticks: int
    step_ticks: int
    peak_flops: Fraction

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    @property
    def seconds(self) -> Fraction:
        return sum(self.terms.values(), Fraction(0))

    @property
    def tokens_per_second(self) -> Fraction:
        return Fraction(form("flops.tokens_per_second", tokens_per_step=self.tokens_per_step,
                             step_time_s=self.seconds))

    def _utilization(self, name: str, per_token: Fraction, key: str) -> Fraction:
        return Fraction(form(name, **{key: per_token}, tokens_per_second=self.tokens_per_second,
                             gpus=self.estimate.hardware.gpus, peak_flops=self.peak_flops))

    @property
    def mfu(self) -> Fraction:
        """Model FLOPs utilization (PaLM Appendix B), ``flops.mfu``."""
        return self._utilization("flops.mfu", self.model_flops_per_token, "flops_per_token")

    @property
    def hfu(self) -> Fraction:
        """Hardware FLOPs utilization (recomputation counted), ``flops.hfu``."""
        return self._utilization("flops.hfu", self.hardware_flops_per_token, "hardware_flops_per_token")

    @property
    def crossing(self) -> tuple[str, ...]:
        """The axes among tp and cp whose groups span nodes."""
        return tuple(a for a in ("tp", "cp") if a in self.axes and self.axes[a].placement.crosses)


def _flops(model: ModelSpec, workload: Workload) -> tuple[Fraction, Fraction]:
    """(model, hardware) FLOPs per token through the catalogue's forms (module doc)."""
    cfg = model.config
    assert cfg is not None and cfg.head_dim is not None, "step_time refuses a model without a shape"
    layers, head = flops_ref.matmul_params(cfg)
    shape = dict(num_layers=cfg.num_layers, seq_len=workload.seq_len, attention_width=cfg.num_heads * cfg.head_dim)
    model_f = Fraction(form("flops.model_per_token", params=layers + head, **shape))
    if workload.recompute == "none":
        return model_f, model_f
    extra = {"layer_params": layers} if workload.recompute == "full" else {}
    return model_f, Fraction(form(f"flops.hardware_per_token.{workload.recompute}", params=layers + head, **extra,
                                  **shape))


def _link(acc: Accelerator, where: Placement) -> Fraction:
    """Bus bandwidth of a group (module doc): half the NVLink figure inside a node, else the group's NICs."""
    if not where.crosses:
        return acc.intra_node_busbw
    return min(acc.intra_node_busbw, where.per_node * Fraction(acc.inter_node_bandwidth))


def _ring(acc: Accelerator, op: str, size: Fraction, n: int, where: Placement) -> Fraction:
    return Fraction(form(f"comm.time_s.ring.{op}", size_bytes=size, n=n, busbw=_link(acc, where), nodes=where.nodes,
                         latency_base=acc.latency_base, latency_intra=acc.latency_intra,
                         latency_inter=acc.latency_inter))


def _sent(op: str, size: Fraction, n: int) -> Fraction:
    """Bytes one rank sends in a ring ``op`` over ``size`` bytes (``comm.bytes_per_rank.<op>``, linear in S)."""
    return Fraction(form(f"comm.bytes_per_rank.{op}", size_bytes=1, n=n)) * size


def _exposed(seconds: Fraction, mode: str, window: Fraction) -> Fraction:
    return seconds if mode == "none" else max(Fraction(0), seconds - window)


@functools.cache
def _pipeline_ticks(schedule: str, p: int, m: int) -> tuple[int, int]:
    """(step_ticks, busiest rank's busy ticks) of the simulated schedule (t_f = 1, t_b = 2)."""
    if p == 1:
        return 1, 1
    from distcheck.parallel.pp import simulate

    tl = simulate(schedule, p, m)
    return tl.step_ticks, max(tl.busy_ticks)


def step_time(model: ModelSpec, hardware: Hardware, workload: Workload, layout: Layout, acc: Accelerator,
              assumptions: Assumptions | None = None) -> StepTime:
    """The step time of ``layout`` (module doc), ``workload.num_microbatches`` micro-batches per replica.

    ``hardware`` gives the GPU count, memory and GPUs per node (the placement); ``acc`` the peak, the links and
    the latencies. Tensor parallelism may cross nodes (that is what the plan prices). Raises ConfigError for a
    model without a shape, or a layout :func:`~distcheck.plan.estimate.check_layout` refuses."""
    if model.config is None:
        raise ConfigError("model", model.name, "has no shape: a step time needs the layers, hidden size and heads "
                                               "(give --model or the shape)")
    a = assumptions or Assumptions()
    e = estimate(model, hardware, workload, layout, tp_within_node=False)
    cfg = model.config
    m, b, s = workload.num_microbatches, workload.micro_batch_size, workload.seq_len
    lay, gpn, conv = layout, hardware.gpus_per_node, workload.convention
    model_f, hw_f = _flops(model, workload)
    t_c = Fraction(form("flops.compute_time_s", flops=hw_f * b * s / (lay.tp * lay.cp * lay.pp),
                        peak_flops=acc.peak_flops, efficiency=a.efficiency))
    backward_window = t_c * (1 - model_f / 3 / hw_f)
    layers = cfg.num_layers // lay.pp
    rerun = Fraction(3, 2) if workload.recompute == "full" else Fraction(1)
    axes: dict[str, AxisTime] = {}
    per_mb: dict[str, Fraction] = {}

    def add(axis: str, seconds: Fraction, nbytes: Fraction, count: int, where: Placement, mode: str,
            window: Fraction) -> None:
        axes[axis] = AxisTime(seconds, _exposed(seconds, mode, window), nbytes, count, where, _link(acc, where), mode)

    if lay.tp > 1:
        where = placement(lay, gpn, ("tp",))
        size = Fraction(b * (s // lay.cp) * cfg.hidden_size * ACTIVATION_BYTES)
        ops = ([Collective.ALL_GATHER, Collective.REDUCE_SCATTER] * 4 if workload.sequence_parallel
               else [Collective.ALL_REDUCE] * 4)
        one = sum((_ring(acc, op, size, lay.tp, where) for op in ops), Fraction(0)) * layers * rerun
        per_mb["tp"] = one
        add("tp", one * m, Fraction(e.comm["tp"] or 0) * rerun, int(len(ops) * layers * rerun) * m, where,
            a.overlap["tp"], t_c * m)
    if lay.cp > 1:
        where = placement(lay, gpn, ("cp",))
        kv = Fraction(2 * s * b * (cfg.num_kv_heads // lay.tp) * (cfg.head_dim or 0) * ACTIVATION_BYTES)
        fwd, bwd = _ring(acc, Collective.ALL_GATHER, kv, lay.cp, where), _ring(acc, Collective.REDUCE_SCATTER, kv,
                                                                                 lay.cp, where)
        k_fwd = 2 if workload.recompute == "full" else 1
        one = (k_fwd * fwd + bwd) * layers
        per_mb["cp"] = one
        cp_bytes = Fraction(e.comm["cp"] or 0) * Fraction(k_fwd + 1, 2)
        add("cp", one * m, cp_bytes, (k_fwd + 1) * layers * m, where, a.overlap["cp"], t_c * m)
    if lay.pp > 1:
        where = placement(lay, gpn, ("pp",))
        sends = 1 if lay.pp == 2 else 2
        boundary = Fraction(b * (s // lay.cp) * cfg.hidden_size * ACTIVATION_BYTES,
                            lay.tp if workload.sequence_parallel else 1)
        bw = Fraction(acc.inter_node_bandwidth) if where.crosses else acc.intra_node_busbw
        one = sends * Fraction(form("comm.time_s.send_recv", size_bytes=boundary, bandwidth=bw,
                                    latency_base=acc.latency_base,
                                    latency_link=acc.latency_inter if where.crosses else acc.latency_intra))
        per_mb["pp"] = one
        axes["pp"] = AxisTime(one * m, _exposed(one, a.overlap["pp"], t_c) * m, sends * m * boundary, sends * m,
                              where, bw, a.overlap["pp"])
    n = lay.shard_ranks
    dp_exposed = Fraction(0)
    if n > 1:
        where = placement(lay, gpn, ("cp", "dp"))
        psi = Fraction(model.params, lay.tp * lay.pp)
        grads, weights = conv.grads * psi, conv.weights * psi
        reduce_op = Collective.ALL_REDUCE if lay.zero == 0 else Collective.REDUCE_SCATTER
        messages = layers if lay.zero == 3 else 1  # ZeRO-3 reduces layer by layer; the others one message
        sync = messages * _ring(acc, reduce_op, grads / messages, n, where)
        sent = _sent(reduce_op, grads, n)
        gather = Fraction(0)
        if lay.zero in (1, 2):  # the updated weights, gathered after the optimizer step: exposed
            gather, sent = _ring(acc, Collective.ALL_GATHER, weights, n, where), sent + _sent(Collective.ALL_GATHER,
                                                                                            weights, n)
        dp_exposed = _exposed(sync, a.overlap["dp"], backward_window) + gather
        axes["dp"] = AxisTime(sync + gather, dp_exposed, sent, messages + (gather > 0), where, _link(acc, where),
                              a.overlap["dp"])
        if lay.zero == 3:  # each layer's weights gathered for every micro-batch's forward and backward (FSDP)
            one = 2 * layers * _ring(acc, Collective.ALL_GATHER, weights / layers, n, where)
            per_mb["fsdp"] = one
            axes["fsdp"] = AxisTime(one * m, _exposed(one, a.overlap["fsdp"], t_c) * m,
                                    2 * m * _sent(Collective.ALL_GATHER, weights, n), 2 * layers * m, where,
                                    _link(acc, where), a.overlap["fsdp"])
    exposed_mb = {k: _exposed(v, a.overlap[k], t_c) for k, v in per_mb.items()}
    t_mb = t_c + sum(exposed_mb.values(), Fraction(0))
    step_ticks, busy = _pipeline_ticks(workload.schedule, lay.pp, m)
    bubble = m * t_mb * (Fraction(step_ticks, busy) - 1)
    zero = Fraction(0)
    terms = {"compute": m * t_c, "tp": m * exposed_mb.get("tp", zero), "cp": m * exposed_mb.get("cp", zero),
             "pp": m * exposed_mb.get("pp", zero), "dp": dp_exposed + m * exposed_mb.get("fsdp", zero),
             "bubble": bubble}
    return StepTime(estimate=e, num_microbatches=m, tokens_per_step=lay.dp * m * b * s, model_flops_per_token=model_f,
                    hardware_flops_per_token=hw_f, terms=terms, axes=axes, busy_ticks=busy, step_ticks=step_ticks,
                    peak_flops=Fraction(acc.peak_flops))
