"""The data behind the plan's memory chart (pure: no matplotlib).

:func:`memory_chart_data` picks the bars of :func:`distcheck.viz.memory_bars`:
ZeRO stages 0-3 under plain data parallelism over every GPU (the lesson's
first three questions), then ZeRO stages 0-3 of the chosen layout's TP × PP
(× CP) split, the chosen bar outlined. Each bar's parts are the
:attr:`Estimate.parts <distcheck.plan.estimate.Estimate.parts>` of its layout,
so a bar's stacked height is that layout's :attr:`~distcheck.plan.estimate.Estimate.total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from distcheck.plan.estimate import Estimate, Hardware, Layout, Workload, estimate
from distcheck.plan.model import ModelSpec
from distcheck.plan.planner import gb

__all__ = ["MemoryChart", "memory_chart_data"]


@dataclass(frozen=True)
class MemoryChart:
    """Bars (``(label, Estimate)``), the group runs ``(name, count)``, the outlined bar and a title."""

    bars: tuple[tuple[str, Estimate], ...]
    groups: tuple[tuple[str, int], ...]
    highlight: int | None
    title: str
    capacity: int | Fraction
    usable: int | Fraction

    def viz_args(self) -> dict:
        """Keyword arguments for :func:`distcheck.viz.memory_bars`."""
        return dict(bars=[(label, e.parts) for label, e in self.bars], capacity_bytes=self.capacity,
                    usable_bytes=self.usable, highlight=self.highlight, title=self.title, groups=list(self.groups))


def _stages(model: ModelSpec, hardware: Hardware, workload: Workload, tp: int, pp: int, cp: int) -> list[Estimate]:
    dp = hardware.gpus // (tp * pp * cp)
    zeros = (0, 1, 2, 3) if dp * cp > 1 else (0,)
    return [estimate(model, hardware, workload, Layout(tp=tp, pp=pp, dp=dp, cp=cp, zero=z)) for z in zeros]


def memory_chart_data(model: ModelSpec, hardware: Hardware, workload: Workload, chosen: Layout) -> MemoryChart:
    """The bars for ``chosen`` (validated by :func:`~distcheck.plan.estimate.check_layout`)."""
    estimate(model, hardware, workload, chosen)  # refuses an invalid layout
    bars: list[tuple[str, Estimate]] = []
    groups: list[tuple[str, int]] = []
    dp_only = _stages(model, hardware, workload, 1, 1, 1)
    bars += [(f"ZeRO-{e.layout.zero}", e) for e in dp_only]
    groups.append((f"DP {hardware.gpus}", len(dp_only)))
    if chosen.tp * chosen.pp * chosen.cp > 1:
        split = _stages(model, hardware, workload, chosen.tp, chosen.pp, chosen.cp)
        bars += [(f"ZeRO-{e.layout.zero}", e) for e in split]
        groups.append((chosen.label.rsplit(",", 1)[0], len(split)))
    highlight = next((i for i, (_, e) in enumerate(bars) if e.layout == chosen), None)
    wl = workload
    title = (f"{model.name} on {hardware.gpus} GPUs of {gb(hardware.gpu_memory)}: memory per GPU\n"
             f"s = {wl.seq_len}, b = {wl.micro_batch_size}, m = {wl.num_microbatches}, {wl.recompute} recompute")
    capacity = hardware.gpu_memory
    assert not isinstance(capacity, str), "Hardware.__post_init__ converts gpu_memory to bytes"
    return MemoryChart(tuple(bars), tuple(groups), highlight, title, capacity, hardware.usable_bytes)
