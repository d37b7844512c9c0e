"""The three figures and the atomic figure writer (see :mod:`distcheck.viz`)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from distcheck.core.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from distcheck.parallel.layout import ParallelConfig
    from distcheck.parallel.pp import Timeline

__all__ = [
    "MAX_GANTT_CELLS", "MAX_DIAGRAM_RANKS", "KIND_COLOURS", "TERM_COLOURS", "require_matplotlib", "pipeline_gantt",
    "memory_bars", "time_bars", "layout_diagram", "save_figure",
]

#: the most cells (ranks x ticks) a Gantt chart draws, one patch per idle tick
MAX_GANTT_CELLS = 20_000
#: the most ranks a layout diagram draws
MAX_DIAGRAM_RANKS = 64

#: cell colours by action kind (F forward, B full backward, I input-gradient, W weight-gradient) and idle
KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868", "idle": "#E6E6E6"}
_KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (inputs)", "W": "backward (weights)", "idle": "idle"}
#: memory components, bottom to top, and their colours
_COMPONENT_COLOURS = {"weights": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868", "activations": "#8172B3"}
#: the terms of a step time, left to right in :func:`time_bars`, and their colours
TERM_COLOURS = {"compute": "#4C72B0", "tp": "#C44E52", "cp": "#DD8452", "pp": "#55A868", "dp": "#8172B3",
                "bubble": "#B8B8B8"}
_GROUP_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                  "#CCB974", "#64B5CD")


def require_matplotlib() -> ModuleType:
    """Import and return matplotlib, or raise ConfigError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("matplotlib", "not installed",
                          "is needed for figures: pip install 'distcheck[plot]'") from None
    return matplotlib


def _new_figure(width: float, height: float) -> Figure:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _pct(q: int | float | Fraction) -> str:
    return f"{float(q) * 100:.1f}%"


def _frac(q: int | Fraction | str) -> str:
    q = Fraction(q)
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


# ----------------------------------------------------------------------------------------------- Gantt


def pipeline_gantt(timeline: Timeline, *, name: str = "", labels: bool | None = None) -> Figure:
    """A Gantt chart of a pipeline timeline: one row per rank (stage), one column per tick.

    Each action is one rectangle spanning its ticks (forward, backward, and the
    split backward's input- and weight-gradient parts in their own colours),
    labelled with its micro-batch (``3``; ``3.1`` for chunk 1 of a rank that
    holds several stages). Each idle tick is its own grey cell, so the chart
    draws exactly ``sum(timeline.idle_ticks)`` idle cells. The title gives the
    step in ticks and the bubble as a fraction of the step and of the ideal time.

    Args:
        timeline: a :class:`distcheck.parallel.pp.Timeline`.
        name: the schedule's name for the title (e.g. ``"1f1b"``).
        labels: draw micro-batch labels; default when the step has at most 120 ticks.

    Returns:
        A ``matplotlib.figure.Figure``. Cells have gids ``F-r<rank>-t<start>``
        (likewise B, I, W) and ``idle-r<rank>-t<tick>``.

    Raises:
        ConfigError: more than :data:`MAX_GANTT_CELLS` cells, or matplotlib missing.
    """
    from matplotlib.patches import Patch, Rectangle

    p, ticks = timeline.num_ranks, timeline.step_ticks
    if p * ticks > MAX_GANTT_CELLS:
        raise ConfigError("num_ranks*step_ticks", p * ticks, f"must be <= {MAX_GANTT_CELLS} cells to draw; "
                                                             "use fewer stages or micro-batches for the figure")
    labels = ticks <= 120 if labels is None else labels
    fig = _new_figure(min(max(6.0, 1.5 + ticks * 0.2), 24.0), 1.3 + 0.42 * p)
    ax = fig.add_subplot()
    origin = min(s.start for s in timeline.spans)
    stages: dict[int, list[int]] = {}
    for s in timeline.spans:
        stages.setdefault(s.rank, [])
        if s.action.stage not in stages[s.rank]:
            stages[s.rank].append(s.action.stage)
    kinds = set()
    for s in timeline.spans:
        kind = s.action.kind
        kinds.add(kind)
        x = s.start - origin
        ax.add_patch(Rectangle((x, s.rank + 0.06), s.end - s.start, 0.88, facecolor=KIND_COLOURS[kind],
                               edgecolor="white", linewidth=0.8, gid=f"{kind}-r{s.rank}-t{x}"))
        if labels:
            text = str(s.action.microbatch)
            if len(stages[s.rank]) > 1:
                text += f".{sorted(stages[s.rank]).index(s.action.stage)}"
            ax.text(x + (s.end - s.start) / 2, s.rank + 0.5, text, ha="center", va="center", fontsize=7,
                    color="white")
    idle = 0
    for rank, row in enumerate(timeline.grid):
        for tick, action in enumerate(row):
            if action is None:
                idle += 1
                ax.add_patch(Rectangle((tick, rank + 0.06), 1, 0.88, facecolor=KIND_COLOURS["idle"], edgecolor="white",
                                       linewidth=0.8, hatch="///", gid=f"idle-r{rank}-t{tick}"))
    ax.set_xlim(0, ticks)
    ax.set_ylim(p, 0)
    ax.set_yticks([r + 0.5 for r in range(p)], [f"rank {r}" for r in range(p)])
    step = max(1, ticks // 20)
    ax.set_xticks(range(0, ticks + 1, step))
    ax.set_xlabel("tick")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    order = [k for k in ("F", "B", "I", "W") if k in kinds] + (["idle"] if idle else [])
    ax.legend(handles=[Patch(facecolor=KIND_COLOURS[k], hatch="///" if k == "idle" else None, label=_KIND_NAMES[k])
                       for k in order], loc="upper center", bbox_to_anchor=(0.5, -0.18 if p > 2 else -0.35),
              ncol=len(order), frameon=False, fontsize=8)
    m = timeline.num_microbatches
    head = f"{name}: " if name else ""
    ax.set_title(f"{head}p = {p}, m = {m}: step {ticks} ticks, bubble {_frac(timeline.bubble_fraction)} = "
                 f"{_pct(timeline.bubble_fraction)} of the step ({_frac(timeline.bubble_ratio)} of the ideal time)",
                 fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------------- memory


def memory_bars(bars: Sequence[tuple[str, Mapping[str, int | Fraction | None]]], capacity_bytes: int | float, *,
                usable_bytes: int | float | None = None,
                highlight: int | None = None, title: str = "", groups: Sequence[tuple[str, int]] = ()) -> Figure:
    """Stacked bars of memory per GPU (GB = 1e9 bytes) with the GPU's capacity line.

    Args:
        bars: ``(label, parts)`` per bar; ``parts`` maps ``"weights"``,
            ``"gradients"``, ``"optimizer"`` and ``"activations"`` to exact bytes
            (missing parts count 0). The segments of bar i are stacked in that
            order and their heights sum to the bar's total.
        capacity_bytes: one GPU's memory, drawn as a red line.
        usable_bytes: when less than the capacity (a reserve), a dashed line too.
        highlight: index of the bar to outline (the chosen layout).
        title: the axes' title.
        groups: ``(name, number of bars)`` runs, labelled under the bars.

    Returns:
        A Figure. Segments have gids ``<component>-<bar index>``; the capacity
        line ``capacity``. Bars taller than three capacities are cut by the
        axis (their patches keep their full height) and labelled with their total.
    """
    from matplotlib.patches import Rectangle  # noqa: F401  (import checks matplotlib before drawing)

    n = len(bars)
    if n == 0:
        raise ConfigError("bars", 0, "must hold at least one bar")
    fig = _new_figure(max(7.0, 3.4 + 0.85 * n), 4.6)
    ax = fig.add_subplot()
    xs = list(range(n))
    totals = [sum((Fraction(parts.get(c, 0) or 0) for c in _COMPONENT_COLOURS), Fraction(0)) for _, parts in bars]
    bottoms = [0.0] * n
    for comp, colour in _COMPONENT_COLOURS.items():
        heights = [float(Fraction(parts.get(comp, 0) or 0) / 10**9) for _, parts in bars]
        container = ax.bar(xs, heights, bottom=bottoms, color=colour, label=comp, width=0.7, edgecolor="white",
                           linewidth=0.5)
        for i, patch in enumerate(container.patches):
            patch.set_gid(f"{comp}-{i}")
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    cap = float(Fraction(capacity_bytes) / 10**9)
    top_total = max(float(t / 10**9) for t in totals)
    ylim = max(top_total, cap) * 1.15 if top_total <= 3 * cap else 3 * cap
    ax.set_ylim(0, ylim)
    line = ax.axhline(cap, color="#cf222e", linewidth=1.5, label=f"GPU memory {cap:,.2f} GB")
    line.set_gid("capacity")
    if usable_bytes is not None and Fraction(usable_bytes) < Fraction(capacity_bytes):
        use = float(Fraction(usable_bytes) / 10**9)
        ax.axhline(use, color="#cf222e", linewidth=1, linestyle="--", label=f"usable {use:,.2f} GB").set_gid("usable")
    for i, t in enumerate(totals):
        gbs = float(t / 10**9)
        y = min(gbs, ylim * 0.93)
        ax.text(i, y + ylim * 0.01, f"{gbs:,.1f}" + (" ▲" if gbs > ylim else ""), ha="center", va="bottom",
                fontsize=8)
    if highlight is not None:
        ax.bar([highlight], [min(float(totals[highlight] / 10**9), ylim)], width=0.78, fill=False,
               edgecolor="#1b1f24", linewidth=2, gid="highlight")
    ax.set_xticks(xs, [label for label, _ in bars], fontsize=8)
    ax.set_ylabel("GB per GPU")
    start = 0
    for gname, count in groups:
        if count and gname:
            ax.annotate(gname, xy=(start + (count - 1) / 2, 0), xycoords=("data", "axes fraction"),
                        xytext=(0, -28), textcoords="offset points", ha="center", va="top", fontsize=9,
                        fontweight="bold")
        start += count
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def time_bars(bars: Sequence[tuple[str, Mapping[str, int | Fraction]]], *, marked: Sequence[int] = (),
              title: str = "") -> Figure:
    """Horizontal stacked bars of step time (seconds), one per layout, in the order given (top to bottom).

    Args:
        bars: ``(label, terms)`` per bar, in rank order; ``terms`` maps the keys of :data:`TERM_COLOURS`
            (``compute``, ``tp``, ``cp``, ``pp``, ``dp``, ``bubble``) to exact seconds (missing terms count 0).
            The segments of bar i are laid end to end in that order and sum to its step time.
        marked: indices of bars to mark (layouts whose TP or CP crosses a node): outlined in red, label suffixed.
        title: the axes' title.

    Returns:
        A Figure. Segments have gids ``<term>-<bar index>``; a marked bar's outline ``crosses-<bar index>``.
    Raises ConfigError for no bars, a negative term, or matplotlib missing.
    """
    n = len(bars)
    if n == 0:
        raise ConfigError("bars", 0, "must hold at least one bar")
    for label, terms in bars:
        for k, v in terms.items():
            if Fraction(v) < 0:
                raise ConfigError(f"{label}: {k}", v, "must be >= 0 seconds")
    fig = _new_figure(9.0, max(2.6, 1.3 + 0.32 * n))
    ax = fig.add_subplot()
    ys = list(range(n))
    lefts = [0.0] * n
    marked_set = set(marked)
    for term, colour in TERM_COLOURS.items():
        widths = [float(Fraction(terms.get(term, 0) or 0)) for _, terms in bars]
        container = ax.barh(ys, widths, left=lefts, color=colour, label=term, height=0.7, edgecolor="white",
                            linewidth=0.5)
        for i, patch in enumerate(container.patches):
            patch.set_gid(f"{term}-{i}")
        lefts = [a + w for a, w in zip(lefts, widths, strict=True)]
    top = max(lefts)
    for i in marked_set:
        ax.barh([i], [lefts[i]], height=0.8, fill=False, edgecolor="#cf222e", linewidth=1.8, gid=f"crosses-{i}")
    for i, total in enumerate(lefts):
        ax.text(total + top * 0.01, i, f"{total:,.2f} s", va="center", fontsize=7)
    ax.set_yticks(ys, [label + ("  (crosses a node)" if i in marked_set else "") for i, (label, _) in
                       enumerate(bars)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel("seconds per step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


# ----------------------------------------------------------------------------------------------- layout


def layout_diagram(cfg: ParallelConfig) -> Figure:
    """The rank groups of each parallel axis of a :class:`distcheck.parallel.layout.ParallelConfig`.

    One panel per axis of degree > 1 (tp, cp, pp, dp, in that order; one panel
    for a single rank). Ranks sit in a grid of nodes (rows) by GPUs of a node
    (columns), ``node = rank // gpus_per_node``; each rank is coloured and
    labelled by its group (:func:`distcheck.parallel.layout.groups`), and thick lines
    mark node boundaries. Cells have gids ``<axis>-g<group>-r<rank>``; node
    boundaries ``<axis>-node-boundary-<k>``.

    Raises:
        ConfigError: ``world_size > MAX_DIAGRAM_RANKS`` (64), a non-config, or matplotlib missing.
    """
    from matplotlib.patches import Rectangle

    from distcheck.parallel import layout

    if not isinstance(cfg, layout.ParallelConfig):
        raise ConfigError("cfg", cfg, "must be a ParallelConfig")
    world, g, order = cfg.world_size, cfg.gpus_per_node, cfg.order
    assert world is not None and isinstance(order, tuple), "ParallelConfig.__post_init__ sets both"
    if world > MAX_DIAGRAM_RANKS:
        raise ConfigError("world_size", world, f"must be <= {MAX_DIAGRAM_RANKS} to draw every rank "
                                               "(distcheck plan layout prints the groups of any size)")
    axes_shown = [a for a in ("tp", "cp", "pp", "dp", "ep") if a in layout.mesh_axes(cfg) and cfg.degree(a) > 1]
    if cfg.ep > 1 and cfg.ep_placement == "inside_dp":
        axes_shown.append("ep")
    axes_shown = axes_shown or ["tp"]
    cols = min(g, world)
    nodes = -(-world // g)
    panel_cols, panel_rows = min(len(axes_shown), 2), -(-len(axes_shown) // 2)
    panel_w, panel_h = 1.3 + 0.55 * cols, 1.0 + 0.5 * nodes
    fig = _new_figure(panel_w * panel_cols, panel_h * panel_rows + 0.4)
    panels = fig.subplots(panel_rows, panel_cols, squeeze=False)
    for k, axis in enumerate(axes_shown):
        ax = panels[k // 2][k % 2]
        group_of = {}
        for gi, members in enumerate(layout.groups(cfg, axis)):
            for r in members:
                group_of[r] = gi
        for r in range(world):
            node, col = divmod(r, g)
            gi = group_of[r]
            ax.add_patch(Rectangle((col, node), 1, 1, facecolor=_GROUP_COLOURS[gi % len(_GROUP_COLOURS)],
                                   edgecolor="white", linewidth=1.5, gid=f"{axis}-g{gi}-r{r}"))
            ax.text(col + 0.5, node + 0.42, str(r), ha="center", va="center", fontsize=8, color="white",
                    fontweight="bold")
            ax.text(col + 0.5, node + 0.8, f"g{gi}", ha="center", va="center", fontsize=5.5, color="white")
        for b in range(1, nodes):
            ax.axhline(b, color="#1b1f24", linewidth=2.5).set_gid(f"{axis}-node-boundary-{b}")
        ax.set_xlim(0, cols)
        ax.set_ylim(nodes, 0)
        ax.set_xticks([c + 0.5 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
        ax.set_yticks([n + 0.5 for n in range(nodes)], [f"node {n}" for n in range(nodes)], fontsize=7)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        where = "inside a node" if layout.groups_node_local(cfg, axis) else "across nodes"
        ax.set_title(f"{axis}: {cfg.num_groups(axis)} groups of {cfg.degree(axis)} ({where})", fontsize=9)
        ax.set_xlabel("GPU in node", fontsize=7)
    for k in range(len(axes_shown), panels.shape[0] * panels.shape[1]):
        panels[k // 2][k % 2].set_visible(False)
    degrees = " × ".join(f"{a} {cfg.degree(a)}" for a in order if cfg.degree(a) > 1) or "1 rank"
    fig.suptitle(f"{degrees} = {world} ranks, {g} GPUs per node, order {'-'.join(order)} (innermost first)",
                 fontsize=10)
    return fig


# ----------------------------------------------------------------------------------------------- save


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (``.png`` or ``.svg``) atomically; return the path.

    SVG keeps text as text and a fixed hash salt, so the same figure gives the
    same file; PNG is rendered at ``dpi``. Raises ConfigError for another
    suffix or a missing folder (before rendering).
    """
    import matplotlib

    from distcheck.reportdoc.atomic import atomic_write

    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ConfigError("--figure", str(target), "must end in .png or .svg")
    if not target.parent.is_dir():
        raise ConfigError("--figure", str(target), f"folder {target.parent} does not exist")
    buf = io.BytesIO()
    if suffix == ".svg":
        with matplotlib.rc_context({"svg.hashsalt": "distcheck", "svg.fonttype": "none"}):
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    else:
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return atomic_write(target, buf.getvalue())
