"""Figures of plans and schedules (matplotlib, Agg; imported only when a figure is asked for).

* :func:`pipeline_gantt`: a pipeline schedule, stages x ticks, one cell per
  forward, backward, weight-gradient or idle tick, micro-batch labels, the
  bubble in the title (from a :class:`distcheck.parallel.pp.Timeline`);
* :func:`memory_bars`: memory per GPU as stacked bars (weights, gradients,
  optimizer state, activations) with the GPU's capacity line;
* :func:`time_bars`: step time per layout as stacked bars (compute, tp, cp, pp, dp, bubble), layouts whose
  TP or CP crosses a node hatched;
* :func:`layout_diagram`: the rank groups of a small mesh (up to
  :data:`MAX_DIAGRAM_RANKS` ranks), one panel per parallel axis, node
  boundaries drawn (from :func:`distcheck.parallel.layout.groups`);
* :func:`save_figure`: write a figure to ``.png`` or ``.svg``, atomically.

Each drawn cell carries a ``gid`` (``idle-r0-t3``, ``weights-2``,
``tp-g1-r5``) that survives into SVG as an element id, so a figure's content can
be checked, not only its existence. matplotlib is an optional dependency
(``pip install 'distcheck[plot]'``); ``import distcheck.viz`` works without it
and the functions raise ConfigError naming it when it is missing. No function
uses pyplot: figures are ``matplotlib.figure.Figure`` objects, so nothing
global (backend, open figures) changes.
"""

from distcheck.viz.figures import (
    KIND_COLOURS,
    MAX_DIAGRAM_RANKS,
    MAX_GANTT_CELLS,
    TERM_COLOURS,
    layout_diagram,
    memory_bars,
    pipeline_gantt,
    require_matplotlib,
    save_figure,
    time_bars,
)

__all__ = [
    "MAX_DIAGRAM_RANKS", "MAX_GANTT_CELLS", "KIND_COLOURS", "TERM_COLOURS", "layout_diagram", "memory_bars",
    "pipeline_gantt", "require_matplotlib", "save_figure", "time_bars",
]
