"""Rank the layouts that fit by step time: ``distcheck plan time``'s planner (pure: no matplotlib, no sympy).

:func:`plan_time` sizes every layout of :func:`distcheck.plan.planner.valid_layouts`, tensor parallelism
across nodes included, at a fixed global batch (``m = global_batch / (dp b)`` micro-batches per replica, so
every layout does the same work per step), keeps those whose memory fits
(:mod:`distcheck.plan.estimate`, at their own ``m``), times each (:mod:`distcheck.plan.steptime`) and sorts
them by step time; ties keep the memory plan's order (:func:`distcheck.plan.planner.rank_key`). Layouts
whose TP or CP groups span nodes are marked, each with the reason its time is what it is: the bandwidth
and latency of its groups beside the best layout that keeps the axis inside a node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.plan.estimate import Hardware, Workload
from distcheck.plan.hardware import Accelerator
from distcheck.plan.model import ModelSpec
from distcheck.plan.planner import rank_key, valid_layouts
from distcheck.plan.steptime import Assumptions, StepTime, step_time

__all__ = ["TimePlan", "plan_time", "time_key", "time_conventions", "default_global_batch", "seconds"]


def seconds(x: Fraction) -> str:
    """Seconds with three significant decimals for the table: ``'14.020'``, ``'0.052'``."""
    return f"{float(x):,.3f}"


def default_global_batch(hardware: Hardware, workload: Workload) -> int:
    """The global batch when none is given: ``num_microbatches x gpus x micro_batch_size`` sequences, the batch of
    the memory plan's pure data-parallel layout (every dp divides it)."""
    return workload.num_microbatches * hardware.gpus * workload.micro_batch_size


def time_key(st: StepTime) -> tuple:
    """The sort key: step time, then :func:`~distcheck.plan.planner.rank_key` (the memory plan's order)."""
    return (st.seconds, rank_key(st.estimate))


@dataclass(frozen=True)
class TimePlan:
    """The result of :func:`plan_time`.

    Attributes:
        model, hardware, workload, accelerator, assumptions, global_batch: the inputs.
        ranked: the layouts that fit, fastest first (:func:`time_key`).
        not_fitting: how many valid layouts do not fit in memory at their ``m``.
        skipped: layouts whose ``dp x micro_batch`` does not divide the global batch.
        reasons: one line per layout of ``ranked`` whose TP or CP crosses a node (by index in ``ranked``).
        conventions: the model's assumptions, one line each.
    """

    model: ModelSpec
    hardware: Hardware
    workload: Workload
    accelerator: Accelerator
    assumptions: Assumptions
    global_batch: int
    ranked: tuple[StepTime, ...]
    not_fitting: int
    skipped: int
    reasons: dict[int, str]
    conventions: tuple[str, ...]


def _gbs(bw: Fraction) -> str:
    return f"{float(bw) / 1e9:,.0f} GB/s"


def _reason(i: int, st: StepTime, ranked: tuple[StepTime, ...], acc: Accelerator) -> str:
    parts = []
    for axis in st.crossing:
        ax = st.axes[axis]
        where = ax.placement
        best = next(((k, o) for k, o in enumerate(ranked) if getattr(o.layout, axis) > 1 and axis not in o.crossing),
                    None)
        nics = f"{where.per_node} NIC{'s' if where.per_node > 1 else ''} of {_gbs(acc.inter_node_bandwidth)}"
        line = (f"{axis.upper()} {getattr(st.layout, axis)} spans {where.nodes} nodes ({where.per_node} of its ranks "
                f"in each): its collectives run at {_gbs(ax.busbw)} ({nics}) instead of {_gbs(acc.intra_node_busbw)} "
                f"inside a node, and their ring steps across nodes wait {float(acc.latency_inter) * 1e6:g} us "
                f"instead of {float(acc.latency_intra) * 1e6:g} us; {axis} takes {seconds(st.terms[axis])} s of "
                f"{seconds(st.seconds)} s")
        if best is not None:
            k, o = best
            line += (f", against {seconds(o.terms[axis])} s of {seconds(o.seconds)} s for #{k + 1} "
                     f"{o.layout.label}, the fastest with {axis.upper()} inside a node")
        parts.append(line)
    return f"#{i + 1} {st.layout.label}: " + "; ".join(parts)


def time_conventions(acc: Accelerator, a: Assumptions, workload: Workload, global_batch: int) -> list[str]:
    """The step-time model's assumptions, one line each (printed with every plan)."""
    overlap = ", ".join(f"{k} {v}" for k, v in a.overlap.items())
    return [
        f"hardware: {acc.title}: {float(acc.peak_flops) / 1e12:,.1f} TFLOP/s dense bf16, {float(acc.hbm_bytes) / 1e9:g}"
        f" GB, NVLink {_gbs(acc.intra_node_bandwidth)} both ways ({_gbs(acc.intra_node_busbw)} one way, a ring's bus "
        f"bandwidth), {acc.gpus_per_node} GPUs per node, {_gbs(acc.inter_node_bandwidth)} network per GPU "
        "(datasheets cited in --format json and the report)",
        f"global batch {global_batch} sequences of {workload.seq_len} tokens per step, the same for every layout: "
        "m = global batch / (dp x micro-batch)",
        f"compute: flops.hardware_per_token.{workload.recompute} (flops.model_per_token = 6 P + 12 L s W without "
        f"recomputation, PaLM Appendix B) at {float(a.efficiency):.0%} of the peak (an assumption: "
        "--compute-efficiency), split evenly over tp x cp x pp",
        "communication: ring collectives timed by comm.time_s.ring.* (NCCL's latencies per collective and per ring "
        "step, nccl-tests' bus bandwidth); inside a node half the NVLink figure, across nodes min(NVLink, ranks per "
        "node x network per GPU); ranks placed tp, cp, pp, dp innermost first",
        f"overlap: {overlap} (none: all exposed; compute: hidden up to the micro-batch's compute; backward: hidden "
        "up to the last micro-batch's backward; ZeRO-1/2's gather after the optimizer step always exposed)",
        f"bubble: the simulator's {workload.schedule} schedule, step_ticks / busy_ticks of the stage time "
        "(compute plus exposed tp, cp, pp and ZeRO-3 gathers)",
        "MFU and HFU: flops.mfu / flops.hfu (PaLM Appendix B): model or hardware FLOPs per token x tokens per second "
        "/ (GPUs x peak)",
    ]


def plan_time(model: ModelSpec, hardware: Hardware, workload: Workload, acc: Accelerator,
              assumptions: Assumptions | None = None, global_batch: int | None = None, *,
              on_progress: Callable[[int, int], None] | None = None) -> TimePlan:
    """Time every valid layout that fits and rank them (module doc).

    Args:
        model: a model with a shape (a raw parameter count has no FLOPs per token).
        hardware: GPUs, memory per GPU, GPUs per node (the placement).
        workload: sequence length, micro-batch, recomputation, schedule; its ``num_microbatches`` is replaced by
            each layout's ``global_batch / (dp micro_batch)``.
        acc: the accelerator (:mod:`distcheck.plan.hardware`); assumptions: efficiency and overlaps.
        global_batch: sequences per step; default :func:`default_global_batch`.
        on_progress: called as ``on_progress(done, total)`` after each layout.

    Raises:
        ConfigError: a model without a shape; a global batch that is not a positive integer or that no layout's
        ``dp x micro_batch`` divides.
    """
    if model.config is None:
        raise ConfigError("model", model.name, "has no shape: plan time needs the layers, hidden size and heads "
                                               "(give --model or the shape, not --params)")
    a = assumptions or Assumptions()
    batch = default_global_batch(hardware, workload) if global_batch is None else global_batch
    check_positive_int("global_batch", batch)
    layouts = valid_layouts(model, hardware, workload, tp_within_node=False)
    b = workload.micro_batch_size
    usable = [lay for lay in layouts if batch % (lay.dp * b) == 0]
    if not usable:
        raise ConfigError("global_batch", batch, f"must be divisible by dp x micro-batch for some layout (micro-batch "
                                                 f"{b}, dp one of {sorted({lay.dp for lay in layouts})})")
    timed = []
    for i, lay in enumerate(usable):
        wl = replace(workload, num_microbatches=batch // (lay.dp * b))
        timed.append(step_time(model, hardware, wl, lay, acc, a))
        if on_progress is not None:
            on_progress(i + 1, len(usable))
    fitting = tuple(sorted((st for st in timed if st.estimate.fits), key=time_key))
    reasons = {i: _reason(i, st, fitting, acc) for i, st in enumerate(fitting) if st.crossing}
    return TimePlan(model=model, hardware=hardware, workload=workload, accelerator=acc, assumptions=a,
                    global_batch=batch, ranked=fitting, not_fitting=len(timed) - len(fitting),
                    skipped=len(layouts) - len(usable), reasons=reasons,
                    conventions=tuple(time_conventions(acc, a, workload, batch)))
