"""Closed forms of pipeline-parallel schedules: step time, busy time, bubble, activation stash.

Conventions (shared with the simulator :mod:`distcheck.parallel.pp`, which this
module does not import): ``p`` ranks (stages), ``m`` micro-batches, ``v`` model
chunks per rank (interleaved only), ``t_f``/``t_b`` the ticks of one forward /
one backward of one stage -- of one *chunk* for the interleaved schedule, so a
rank's ideal (bubble-free) time is ``v * m * (t_f + t_b)``. Communication is
free. Two bubble conventions (Huang et al. 2019, "GPipe", §2.3; Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.2):

* ``bubble_fraction`` = idle / total time (0..1), GPipe's ``(p-1)/(m+p-1)``;
* ``bubble_ratio`` = idle / ideal time, Narayanan et al.'s ``(p-1)/m``;
  they are related by ``fraction = ratio / (1 + ratio)``;
* ``idle_ticks`` = the bubble in ticks on each rank, ``(p-1)(t_f+t_b)`` for all
  three schedules (every rank idles equally; the lesson's 21-tick GPipe step
  with p = m = 4 has 9 idle ticks per rank).

Finding on the interleaved schedule (checked against the tick simulator, see
``tests/test_pipeline.py``). With chunk costs ``t_f``, ``t_b`` and Megatron-LM's
interleaved order (the one ``torch.distributed.pipelining.ScheduleInterleaved1F1B``
also builds when ``m % p == 0``), the step takes exactly
``(v*m + p - 1) * (t_f + t_b)`` ticks for every ``p >= 1``, ``v >= 2``, ``m`` a
multiple of ``p`` and every tested ``t_f, t_b`` (ratios 1:5 .. 7:3, not only
1:2): the bubble is ``(p-1)(t_f+t_b)`` per rank, so Narayanan et al. 2021
§2.2.2's ``(1/v)(p-1)/m`` is the exact bubble ratio, not an approximation, under
``m % p == 0``. Megatron's order is only defined for ``m % p == 0`` (its
micro-batch groups have ``p`` members). torch 2.13's "flex" variant for other
``m`` was also replayed (p = 2..6, m = 1..14, v = 2..4): its step is
``(v*max(m, p) + min(m, p) - 1) * (t_f + t_b)``, i.e. the same formula for
``m > p`` but a longer step for ``m < p``; that variant is not catalogued here.

The breadth-first order (``looped_bfs``: every micro-batch through chunk 0, then chunk 1,
...) has that same step, ``(v*max(m, p) + min(m, p) - 1) * (t_f + t_b)``, for every m
(found with the simulator, p = 1..6, m = 1..14, v = 1..4, seven cost ratios; property
``pp.simulator.closed_forms``), and stashes all ``v m`` (chunk, micro-batch) pairs.

The forms of the split-backward schedules (ZB-H1, ZB-H2, interleaved ZB, ZB-V, DualPipe,
DualPipeV) are in :mod:`distcheck.parallel.pp.forms_zero_bubble`, registered with these.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register
from distcheck.parallel.pp import forms_zero_bubble

__all__ = ["FORMS", "ZERO_BUBBLE_FORMS"]

#: the forms of the split-backward schedules, registered with :data:`FORMS`
ZERO_BUBBLE_FORMS = forms_zero_bubble.FORMS

_P = Input("p", "pipeline ranks (stages)", "ranks")
_M = Input("m", "micro-batches per step", "micro-batches")
_V = Input("v", "model chunks per rank (interleaved; >= 2)", "chunks")
_V1 = Input("v", "model chunks per rank (1 without interleaving)", "chunks", default=1)
_TF = Input("t_f", "ticks of one forward of one stage (one chunk when interleaved)", "ticks", default=1)
_TB = Input("t_b", "ticks of one backward of one stage (one chunk when interleaved)", "ticks", default=2)

p, m, v, t_f, t_b = (i.symbol for i in (_P, _M, _V, _TF, _TB))

_GPIPE = ("GPipe (Huang et al. 2019, arXiv:1811.06965, §2.3: bubble O((K-1)/(M+K-1))); "
          "lesson 'Scaling and distributed training', 'Pipeline bubble'")
_NARAYANAN_1F1B = "Narayanan et al. 2021 (SC'21), §2.2.1: PipeDream-Flush bubble (p-1)/m relative to ideal time"
_NARAYANAN_INT = "Narayanan et al. 2021 (SC'21), §2.2.2: interleaved bubble (1/v)(p-1)/m; exact per the tick simulator"
_INT_CONSTRAINTS = ("v >= 2", "m % p == 0 (Megatron-LM's interleaved order; Narayanan et al. 2021 §2.2.2)")

_BFS = ("Lamy-Poirier 2023, 'Breadth-First Pipeline Parallelism' (arXiv:2211.05953); torch's ScheduleLoopedBFS; "
        "exact per the tick simulator")
_VB = Input("v", "model chunks per rank (1 or more)", "chunks", default=1)
_BFS_STEPS = v * sp.Max(m, p) + sp.Min(m, p) - 1

_BASE = (_P, _M, _TF, _TB)
_INTER = (_P, _M, _V, _TF, _TB)


def _form(name: str, expr: sp.Expr, inputs: tuple[Input, ...], unit: str, source: str, description: str,
          constraints: Sequence[str] = ()) -> ClosedForm:
    return register(ClosedForm(name, sp.simplify(expr), inputs, unit, source, description, tuple(constraints)))


FORMS: tuple[ClosedForm, ...] = (
    # --- step time
    _form(
        "pp.step_ticks.gpipe", (m + p - 1) * (t_f + t_b), _BASE, "ticks", _GPIPE,
        "ticks of one GPipe step: m + p - 1 forward slots, then as many backward slots",
    ),
    _form(
        "pp.step_ticks.1f1b", (m + p - 1) * (t_f + t_b), _BASE, "ticks", _NARAYANAN_1F1B,
        "ticks of one 1F1B (PipeDream-Flush) step: same length as GPipe, for every m >= 1",
    ),
    _form(
        "pp.step_ticks.interleaved", (v * m + p - 1) * (t_f + t_b), _INTER, "ticks", _NARAYANAN_INT,
        "ticks of one interleaved 1F1B step with v chunks per rank and per-chunk costs t_f, t_b",
        _INT_CONSTRAINTS,
    ),
    # --- useful work
    _form(
        "pp.busy_ticks", v * m * (t_f + t_b), (_P, _M, _V1, _TF, _TB), "ticks",
        "lesson 'Scaling and distributed training' ('Pipeline bubble': each stage is busy 3m ticks); "
        "Narayanan et al. 2021 §2.2 (ideal time)",
        "ticks each rank spends computing in one step (the ideal time): v*m forwards and v*m backwards; "
        "the same for every rank and every schedule",
    ),
    # --- idle time (the bubble in ticks), per rank
    _form(
        "pp.idle_ticks.gpipe", (p - 1) * (t_f + t_b), _BASE, "ticks", _GPIPE,
        "ticks each rank idles in one GPipe step: (p-1)(t_f+t_b), the same for every rank",
    ),
    _form(
        "pp.idle_ticks.1f1b", (p - 1) * (t_f + t_b), _BASE, "ticks", _NARAYANAN_1F1B,
        "ticks each rank idles in one 1F1B step: (p-1)(t_f+t_b), the same for every rank",
    ),
    _form(
        "pp.idle_ticks.interleaved", (p - 1) * (t_f + t_b), _INTER, "ticks", _NARAYANAN_INT,
        "ticks each rank idles in one interleaved 1F1B step: (p-1)(t_f+t_b) per rank, independent of v",
        _INT_CONSTRAINTS,
    ),
    # --- bubble, relative to the total
    _form(
        "pp.bubble_fraction.gpipe", (p - 1) / (m + p - 1), _BASE, "fraction", _GPIPE,
        "idle time / total step time of GPipe (all ranks together); independent of t_f and t_b",
    ),
    _form(
        "pp.bubble_fraction.1f1b", (p - 1) / (m + p - 1), _BASE, "fraction",
        _NARAYANAN_1F1B + "; converted with fraction = ratio / (1 + ratio)",
        "idle time / total step time of 1F1B: the same bubble as GPipe",
    ),
    _form(
        "pp.bubble_fraction.interleaved", (p - 1) / (v * m + p - 1), _INTER, "fraction",
        _NARAYANAN_INT + "; converted with fraction = ratio / (1 + ratio)",
        "idle time / total step time of interleaved 1F1B",
        _INT_CONSTRAINTS,
    ),
    # --- bubble, relative to the ideal time
    _form(
        "pp.bubble_ratio.gpipe", (p - 1) / m, _BASE, "fraction",
        _NARAYANAN_1F1B + " (holds for GPipe too)",
        "idle time / ideal time of GPipe; can exceed 1 when m < p - 1",
    ),
    _form(
        "pp.bubble_ratio.1f1b", (p - 1) / m, _BASE, "fraction", _NARAYANAN_1F1B,
        "idle time / ideal time of 1F1B",
    ),
    _form(
        "pp.bubble_ratio.interleaved", (p - 1) / (v * m), _INTER, "fraction", _NARAYANAN_INT,
        "idle time / ideal time of interleaved 1F1B: (1/v) of the 1F1B ratio, exactly",
        _INT_CONSTRAINTS,
    ),
    # --- activation stash (micro-batches whose forward ran and whose backward has not finished)
    _form(
        "pp.peak_in_flight.gpipe", m, _BASE, "count",
        "Narayanan et al. 2021 §2.2.1 (GPipe stashes m micro-batches); Huang et al. 2019",
        "peak number of micro-batches whose activations a GPipe rank holds: m, on every stage (stage 0 included)",
    ),
    _form(
        "pp.peak_in_flight.1f1b", sp.Min(p, m), _BASE, "count",
        "Narayanan et al. 2021 §2.2.1 (1F1B keeps at most p micro-batches in flight)",
        "peak number of micro-batches in flight on stage 0 (the maximum over stages) under 1F1B; "
        "stage r holds min(p - r, m)",
    ),
    _form(
        "pp.peak_in_flight.interleaved", sp.Min((v + 1) * p - 1, v * m), _INTER, "count",
        "derived from Megatron-LM's interleaved warm-up count min(2(p-r-1) + (v-1)p, v m); "
        "checked by the tick simulator",
        "peak number of (chunk, micro-batch) activation stashes on rank 0 (the maximum over ranks) under "
        "interleaved 1F1B; each stash is one chunk's activations (1/v of the rank's layers); "
        "rank r holds min(2(p-r-1) + (v-1)p + 1, v m)",
        _INT_CONSTRAINTS,
    ),
    # --- breadth-first (looped BFS): v chunks, every micro-batch through one chunk before the next
    _form("pp.step_ticks.looped_bfs", _BFS_STEPS * (t_f + t_b), (_P, _M, _VB, _TF, _TB), "ticks",
          _BFS, "ticks of one breadth-first step: (v max(m, p) + min(m, p) - 1)(t_f + t_b); "
          "(v m + p - 1)(t_f + t_b) when m >= p"),
    _form("pp.idle_ticks.looped_bfs", (_BFS_STEPS - v * m) * (t_f + t_b), (_P, _M, _VB, _TF, _TB),
          "ticks", _BFS, "ticks each rank idles in one breadth-first step; (p-1)(t_f+t_b) when m >= p"),
    _form("pp.bubble_fraction.looped_bfs", (_BFS_STEPS - v * m) / _BFS_STEPS, (_P, _M, _VB, _TF, _TB),
          "fraction", _BFS, "idle time / total step time of the breadth-first schedule"),
    _form("pp.bubble_ratio.looped_bfs", (_BFS_STEPS - v * m) / (v * m), (_P, _M, _VB, _TF, _TB),
          "fraction", _BFS, "idle time / ideal time of the breadth-first schedule: (p-1)/(v m) when m >= p"),
    _form("pp.peak_in_flight.looped_bfs", v * m, (_P, _M, _VB, _TF, _TB), "count", _BFS,
          "peak (chunk, micro-batch) activations of a breadth-first rank: all v m, like GPipe over v chunks"),
)
