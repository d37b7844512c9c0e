"""Closed forms of the split-backward schedules (ZB-H1, ZB-H2, interleaved ZB, ZB-V, DualPipe, DualPipeV).

Registered by :mod:`distcheck.parallel.pp.forms` (the package's ``forms`` role imports this module).

Convention. ``t_f`` one forward, ``t_i`` the backward for the INPUTS only (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism", write it ``T_B``), ``t_w`` the backward for the weights,
all per stage (per chunk) in ticks; a full backward is ``t_i + t_w`` (``t_b`` of the other
``pp.*`` forms; DeepSeek-V3's Table 2 and the DualPipe README write it ``B``). ``t_fb``
is one overlapped forward + full backward (DualPipe's "F&B"); ``t`` is the common cost when
``t_f = t_i = t_w`` (the papers' equal-cost assumption). The forms named ``*.b_input`` and
``*.b_full`` take the backward ``b`` as a source prints it and read it as the input-gradient
part or as the full backward: the audit tries the other reading and names the one under
which a printed figure holds.

Quantities, each exact against the simulator (:mod:`distcheck.parallel.pp.schedules`) inside
its ``constraints`` (property ``pp.zero_bubble.closed_forms``):

* ``pp.bubble_ticks.<s>``: idle ticks of the rank that idles most in one step, with a
  barrier between steps (step = first start to last end);
* ``pp.bubble_ticks.<s>.steady``: idle ticks inside a rank's own window (first start
  to last end): the bubble when consecutive steps overlap (no optimizer barrier);
* ``pp.bubble_fraction.<s>`` (idle / total) and ``pp.bubble_ratio.<s>`` (idle /
  ideal), all ranks together, with a barrier (``.steady``: without);
* ``pp.peak_in_flight.<s>``: peak (stage, micro-batch) activations one rank holds, from
  the start of the forward to the end of the last backward piece (``W`` when split); with two
  stages per rank each is half a rank's layers;
* ``pp.parameter_copies.<s>``: copies of the model's parameters the pipeline holds;
  ``pp.params_per_device.<s>``: parameters per device relative to 1F1B over the same
  number of stages.

Where the published formulas hold, and the smallest cases where they do not, are in
docs/PIPELINES.md; the ``*.published*`` forms carry the regimes in their constraints.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register
from distcheck.core.vocab import Schedule

__all__ = ["FORMS", "regime"]

_P = Input("p", "pipeline ranks", "ranks")
_PE = Input("p", "pipeline ranks (even)", "ranks")
_M = Input("m", "micro-batches per step", "micro-batches")
_V = Input("v", "stages (model chunks) per rank", "chunks", default=2)
_TF = Input("t_f", "ticks of one forward of one stage", "ticks", default=1)
_TI = Input("t_i", "ticks of one input-gradient backward (T_B of Qi et al.)", "ticks", default=1)
_TW = Input("t_w", "ticks of one weight-gradient backward (W)", "ticks", default=1)
_B = Input("b", "ticks of the backward B as the source prints it", "ticks")
_T = Input("t", "ticks of each of F, I (input backward) and W, taken equal", "ticks", default=1)
_TFB = Input("t_fb", "ticks of one overlapped forward + full backward (F&B)", "ticks", default=3)
_PP = Input("pp", "pipeline stages PP (DualPipe: ranks; DualPipeV: 2 x ranks)", "stages")

p, m, v, t_f, t_i, t_w, b, t, t_fb, pp = (x.symbol for x in (_P, _M, _V, _TF, _TI, _TW, _B, _T, _TFB, _PP))

_QI = "Qi et al. 2023, 'Zero Bubble Pipeline Parallelism' (arXiv:2401.10241)"
_QI_README = "the zero-bubble repository's README (sail-sg/zero-bubble-pipeline-parallelism)"
_DS = ("DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv:2412.19437), §3.2.1, Table 2; the DualPipe "
       "repository's README (deepseek-ai/DualPipe)")
_TORCH = "torch.distributed.pipelining's ScheduleInterleavedZeroBubble"
_SIM = "; exact per the simulator (distcheck.parallel.pp)"
_EQUAL = "t_f == t_i == t_w == t (the papers' equal-cost assumption)"
_DUAL = "2t <= t_fb <= 3t"
_SPLIT = (_P, _M, _TF, _TI, _TW)

_H1 = (p - 1) * sp.Max(t_f + t_i - t_w, t_f, t_i)
_H2 = (p - 1) * sp.Max(t_f, t_f + t_i - 2 * t_w, t_i - t_f)
_H2_STEADY = (p - 1) * sp.Max(0, t_f + t_i - 2 * t_w, t_i - t_f)
_WORK = m * (t_f + t_i + t_w)
_PER_ROUND = m / sp.Max(1, sp.floor(m / p))


def _form(name: str, expr: sp.Expr, inputs: Sequence[Input], unit: str, source: str, description: str,
          constraints: Sequence[str] = ()) -> ClosedForm:
    return register(ClosedForm(name, expr, tuple(inputs), unit, source, description, tuple(constraints)))


def _trio(schedule: str, bubble: sp.Expr, work: sp.Expr, inputs: Sequence[Input], source: str,
          constraints: Sequence[str], what: str, steady: sp.Expr | None = None) -> tuple[ClosedForm, ...]:
    """bubble_ticks, bubble_fraction and bubble_ratio of one schedule (and their .steady forms)."""
    out = [
        # builds pp.bubble_ticks.interleaved_zb, pp.bubble_ticks.zb_h1, pp.bubble_ticks.zb_h2, pp.bubble_ticks.zb_v
        _form(f"pp.bubble_ticks.{schedule}", bubble, inputs, "ticks", source + _SIM,
              f"idle ticks per rank of one {what} step (the rank that idles most), with a barrier between steps",
              constraints),
        # builds:
        #   pp.bubble_fraction.interleaved_zb, pp.bubble_fraction.zb_h1, pp.bubble_fraction.zb_h2,
        #   pp.bubble_fraction.zb_v
        _form(f"pp.bubble_fraction.{schedule}", bubble / (bubble + work), inputs, "fraction", source + _SIM,
              f"idle / total time of one {what} step, all ranks, with a barrier between steps", constraints),
        # builds pp.bubble_ratio.interleaved_zb, pp.bubble_ratio.zb_h1, pp.bubble_ratio.zb_h2, pp.bubble_ratio.zb_v
        _form(f"pp.bubble_ratio.{schedule}", bubble / work, inputs, "fraction", source + _SIM,
              f"idle / ideal time of one {what} step, all ranks, with a barrier between steps", constraints),
    ]
    if steady is not None:
        out += [
            # builds pp.bubble_ticks.zb_h2.steady, pp.bubble_ticks.zb_v.steady
            _form(f"pp.bubble_ticks.{schedule}.steady", steady, inputs, "ticks", source + _SIM,
                  f"idle ticks inside each {what} rank's own window (steps overlap: no optimizer barrier)",
                  constraints),
            # builds pp.bubble_ratio.zb_h2.steady, pp.bubble_ratio.zb_v.steady
            _form(f"pp.bubble_ratio.{schedule}.steady", steady / work, inputs, "fraction", source + _SIM,
                  f"idle / ideal time of {what} without a barrier between steps: the idle ticks inside the window of "
                  "the rank that idles most, over one rank's work",
                  constraints),
        ]
    return tuple(out)


FORMS: tuple[ClosedForm, ...] = (
    # --- 1F1B with the backward written as its two parts
    _form("pp.bubble_ticks.1f1b", (p - 1) * (t_f + t_i + t_w), (_P, _TF, _TI, _TW), "ticks",
          _QI + ", Table 2 (1F1B: (p-1)(T_F+T_B+T_W))" + _SIM,
          "idle ticks per rank of one 1F1B step, the backward written as input + weight parts "
          "(pp.idle_ticks.1f1b with t_b = t_i + t_w)"),
    _form("pp.bubble_ticks.1f1b.b_input", (p - 1) * (t_f + b + t_w), (_P, _TF, _B, _TW), "ticks",
          _QI + ", Table 2 (B = input gradient)", "1F1B idle ticks per rank with b read as the input-gradient "
          "backward (Qi et al.'s T_B): (p-1)(t_f + b + t_w)"),
    _form("pp.bubble_ticks.1f1b.b_full", (p - 1) * (t_f + b), (_P, _TF, _B, _TW), "ticks",
          _DS + " (1F1B: (PP-1)(F+B), B = full backward)", "1F1B idle ticks per rank with b read as the FULL "
          "backward (DeepSeek-V3's B): (p-1)(t_f + b); t_w is part of b", ("b > t_w",)),
    # --- ZB-H1
    *_trio(Schedule.ZB_H1, _H1, _WORK, _SPLIT, _QI + ", §2.1 (ZB-H1)", ("m >= p",), "ZB-H1"),
    _form("pp.bubble_ticks.zb_h1.published", (p - 1) * (t_f + t_i - t_w), (_P, _TF, _TI, _TW), "ticks",
          _QI + ", Table 2 (ZB-H1: (p-1)(T_F+T_B-T_W))", "the ZB-H1 bubble as published",
          ("m >= p", "t_w <= t_f and t_w <= t_i (else the bubble is (p-1) max(t_f, t_i))")),
    _form("pp.bubble_ticks.zb_h1.b_input", (p - 1) * sp.Max(t_f + b - t_w, t_f, b), (_P, _TF, _B, _TW), "ticks",
          _QI + ", Table 2 (B = input gradient)" + _SIM,
          "ZB-H1 idle ticks per rank with b read as the input-gradient backward (Qi et al.'s T_B)", ("m >= p",)),
    _form("pp.bubble_ticks.zb_h1.b_full", (p - 1) * sp.Max(t_f + b - 2 * t_w, t_f, b - t_w), (_P, _TF, _B, _TW),
          "ticks", _DS + " (ZB1P: (PP-1)(F+B-2W), B = full backward)" + _SIM,
          "ZB-H1 idle ticks per rank with b read as the FULL backward (DeepSeek-V3's B; input part b - t_w)",
          ("m >= p", "b > t_w")),
    _form("pp.peak_in_flight.zb_h1", sp.Min(p, m), (_P, _M), "count", _QI + ", §2.1 (peak memory p M_B)" + _SIM,
          "peak micro-batches whose activations one ZB-H1 rank holds (until their W): min(p, m), on every rank when "
          "m >= p"),
    # --- ZB-H2
    *_trio(Schedule.ZB_H2, _H2, _WORK, _SPLIT, _QI + ", §2.2 (ZB-H2)", ("m >= 2p - 1",), "ZB-H2", steady=_H2_STEADY),
    _form("pp.bubble_ticks.zb_h2.published", (p - 1) * (t_f + t_i - 2 * t_w), (_P, _TF, _TI, _TW), "ticks",
          _QI + ", Table 2 (ZB-H2: (p-1)(T_F+T_B-2T_W))", "the ZB-H2 bubble as published: the steady bubble",
          ("m >= 2p - 1", "t_w <= t_f and 2 t_w <= t_f + t_i (equals pp.bubble_ticks.zb_h2.steady there)")),
    _form("pp.bubble_ticks.zb_h2.steady.b_input", (p - 1) * sp.Max(0, t_f + b - 2 * t_w, b - t_f),
          (_P, _TF, _B, _TW), "ticks", _QI + ", Table 2 (B = input gradient)" + _SIM,
          "ZB-H2 steady idle ticks per rank with b read as the input-gradient backward", ("m >= 2p - 1",)),
    _form("pp.bubble_ticks.zb_h2.steady.b_full", (p - 1) * sp.Max(0, t_f + b - 3 * t_w, b - t_w - t_f),
          (_P, _TF, _B, _TW), "ticks", _QI + ", Table 2, read with B = full backward" + _SIM,
          "ZB-H2 steady idle ticks per rank with b read as the FULL backward (input part b - t_w)",
          ("m >= 2p - 1", "b > t_w")),
    _form("pp.peak_in_flight.zb_h2", sp.Min(2 * p - 1, m), (_P, _M), "count",
          _QI + ", §2.2 (peak memory (2p-1) M_B)" + _SIM, "peak micro-batches whose activations one ZB-H2 rank holds"),
    # --- interleaved ZB (torch)
    *_trio(Schedule.INTERLEAVED_ZB, _H1, v * _WORK, (_P, _M, _V, _TF, _TI, _TW), _TORCH + " (ZB-H1 over v chunks)",
           ("m >= p", "m % max(1, m // p) == 0"), "interleaved zero-bubble"),
    _form("pp.peak_in_flight.interleaved_zb", sp.Min((v - 1) * _PER_ROUND + p, v * m), (_P, _M, _V), "count",
          _TORCH + " (warm-up (v-1) rounds + p - 1 - r forwards)" + _SIM,
          "peak (chunk, micro-batch) activations of rank 0 (the most of any rank): min((v-1) m/max(1, m//p) + p, v m)",
          ("m % max(1, m // p) == 0",)),
    # --- ZB-V (equal costs)
    *_trio(Schedule.ZB_V, (p - 1) * t, 6 * m * t, (_P, _M, _T), _QI + ", §6 (ZB-V)", (_EQUAL, "m >= 2p"), "ZB-V",
           steady=0 * p * t),
    _form("pp.peak_in_flight.zb_v", 2 * sp.Min(p, m), (_P, _M), "count", _QI + ", §6 (the memory of 1F1B)" + _SIM,
          "peak (stage, micro-batch) activations one ZB-V rank holds; each is half a rank's layers, so 2p of them is "
          "1F1B's p micro-batches", ("m >= 2p",)),
    # --- DualPipeV (p ranks, PP = 2p stages) and DualPipe (p ranks = PP stages, two copies)
    _form("pp.bubble_ticks.dualpipev", (p - 1) * (t_fb - t), (_P, _M, _T, _TFB), "ticks", _DS + _SIM,
          "idle ticks of the DualPipeV rank that idles most: (p-1)(t_fb - t) = (PP/2-1)(F&B+B-3W) with PP = 2p",
          (_EQUAL, _DUAL, "m >= 2p")),
    _form("pp.bubble_ticks.dualpipe", (p / 2 - 1) * (t_fb - t), (_PE, _M, _T, _TFB), "ticks", _DS + _SIM,
          "idle ticks of the DualPipe rank that idles most: (p/2-1)(t_fb - t) = (PP/2-1)(F&B+B-3W) with PP = p",
          (_EQUAL, _DUAL, "p even", "m even", "m >= 2p")),
    _form("pp.bubble_ticks.dualpipe.published", (pp / 2 - 1) * (t_fb + b - 3 * t_w), (_PP, _TFB, _B, _TW),
          "ticks", _DS + " ((PP/2-1)(F&B+B-3W), B = full backward)",
          "the DualPipe / DualPipeV bubble as published; PP = stages, b = the full backward",
          ("t_f == t_w == b / 2 (equal F, input and weight passes)", "b <= t_fb <= 3 b / 2")),
    _form("pp.bubble_fraction.dualpipev", (p - 1) / (p - 1 + 3 * m), (_P, _M), "fraction", _DS + _SIM,
          "idle / total time of one DualPipeV step, equal costs, no gain from overlapping (t_fb = 3t)",
          (_EQUAL, "t_fb == 3t", "m >= 2p")),
    _form("pp.bubble_ratio.dualpipev", (p - 1) / (3 * m), (_P, _M), "fraction", _DS + _SIM,
          "idle / ideal time of one DualPipeV step, equal costs, t_fb = 3t", (_EQUAL, "t_fb == 3t", "m >= 2p")),
    _form("pp.bubble_fraction.dualpipe", (p - 2) / (p - 2 + 3 * m), (_PE, _M), "fraction", _DS + _SIM,
          "idle / total time of one DualPipe step, equal costs, no gain from overlapping (t_fb = 3t)",
          (_EQUAL, "t_fb == 3t", "p even", "m even", "m >= 2p")),
    _form("pp.bubble_ratio.dualpipe", (p - 2) / (3 * m), (_PE, _M), "fraction", _DS + _SIM,
          "idle / ideal time of one DualPipe step, equal costs, t_fb = 3t",
          (_EQUAL, "t_fb == 3t", "p even", "m even", "m >= 2p")),
    _form("pp.peak_in_flight.dualpipev", 2 * p + 1, (_P, _M), "count", _DS + " (PP+1 activations)" + _SIM,
          "peak (stage, micro-batch) activations one DualPipeV rank holds: PP + 1 = 2p + 1 stage-activations",
          ("m >= 2p",)),
    _form("pp.peak_in_flight.dualpipe", p + 1, (_PE, _M), "count", _DS + " (PP+1 activations)" + _SIM,
          "peak (stage, micro-batch) activations one DualPipe rank holds: PP + 1 = p + 1",
          ("p even", "m even", "m >= 2p")),
    _form("pp.parameter_copies.dualpipe", sp.Integer(2) + 0 * p, (_PE,), "count", _DS + " (2x parameters)" + _SIM,
          "copies of the model's parameters a DualPipe pipeline holds: 2 (one per direction)", ("p even",)),
    _form("pp.parameter_copies.dualpipev", sp.Integer(1) + 0 * p, (_P,), "count", _DS + _SIM,
          "copies of the model's parameters a DualPipeV pipeline holds: 1 (cut in half: PP/2 devices)"),
    _form("pp.params_per_device.dualpipe", sp.Integer(2) + 0 * p, (_PE,), "count",
          _DS + " (parameter per device 2x)" + _SIM,
          "parameters per device relative to 1F1B over the same number of stages: 2 (a stage of each copy)",
          ("p even",)),
    _form("pp.params_per_device.dualpipev", sp.Integer(2) + 0 * p, (_P,), "count",
          _DS + " (parameter per device 2x)" + _SIM,
          "parameters per device relative to 1F1B over the same number of stages: 2 (two of the 2p stages)"),
    _form("pp.parameter_copies.zb_h1", sp.Integer(1) + 0 * p, (_P,), "count", _QI + _SIM,
          "copies of the model's parameters a ZB-H1 (or ZB-H2, ZB-V, 1F1B) pipeline holds: 1"),
)


def regime(schedule: str, *, p: int, m: int, t_f: int, t_i: int, t_w: int, t_fb: int | None = None) -> str | None:
    """None when the exact forms of a split schedule hold at these values; else the rule broken
    (the forms' constraints, as code)."""
    if schedule in (Schedule.ZB_H1, Schedule.INTERLEAVED_ZB) and m < p:
        return f"m={m} must be >= p={p}"
    if schedule == Schedule.ZB_H2 and m < 2 * p - 1:
        return f"m={m} must be >= 2p - 1 = {2 * p - 1}"
    if schedule in (Schedule.ZB_V, Schedule.DUALPIPE, Schedule.DUALPIPEV):
        if m < 2 * p:
            return f"m={m} must be >= 2p = {2 * p}"
        if not t_f == t_i == t_w:
            return f"t_f={t_f}, t_i={t_i}, t_w={t_w} must be equal"
        if schedule != Schedule.ZB_V and t_fb is not None and not 2 * t_f <= t_fb <= 3 * t_f:
            return f"t_fb={t_fb} must lie in [2t, 3t] = [{2 * t_f}, {3 * t_f}]"
    return None
