"""Enumerate every valid layout for a GPU count, rank them, and walk the lesson's questions.

The lesson "Scaling and distributed training" (section 5, "Choosing a
strategy") asks, in order: does the whole training state fit one GPU (DDP)?
does it fit with optimizer state and gradients sharded (ZeRO-1 or ZeRO-2, the
same communication as DDP)? with everything sharded (ZeRO-3 / FSDP)? and for
the largest models, tensor parallelism inside each server and pipeline
parallelism across servers. :func:`plan` answers each question with the best
layout of its kind, under the conventions of :mod:`distcheck.plan.estimate`,
and recommends the first that fits. Context parallelism, which the lesson does
not cover, is asked last.

Ranking (:func:`rank_key`): layouts that fit first; then by the lesson's
question (simplest strategy first); then ZeRO-0/1/2 before ZeRO-3 (the first
three send the same bytes as DDP; ZeRO-3 re-gathers the weights for every
micro-batch, 1.5x DDP's bytes at m = 1 and more with more micro-batches); then
the fewest GPUs per model replica (``tp * pp * cp``: more data parallelism);
then the smaller bubble; then the larger tp (tensor parallelism stays inside
a node, so a split with fewer pipeline stages is preferred, as
:func:`distcheck.parallel.memory.min_tp_pp` breaks ties); then the lower ZeRO stage;
then less communication; then fewer bytes.

Other orders (:data:`SORT_KEYS`, ``distcheck plan memory --sort``; :func:`sort_estimates`): ``memory``,
``comm`` and ``bubble`` keep the layouts that fit first, then order by bytes per GPU, bytes each GPU
sends per step, or the bubble, ties in the lesson's order. The recommendation is the lesson's, whatever
the order of the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.units import format_bytes
from distcheck.core.validate import check_choice
from distcheck.parallel import layout as layout_ref
from distcheck.parallel import memory as memory_ref
from distcheck.plan.estimate import Estimate, Hardware, Layout, Workload, check_layout, conventions, estimate
from distcheck.plan.inputs import LESSON_STEPS
from distcheck.plan.model import ModelSpec

__all__ = ["Question", "Plan", "valid_layouts", "rank_key", "plan", "smallest_tp_pp_before_activations", "gb",
           "SORT_KEYS", "sort_estimates"]


def gb(n_bytes: Any) -> str:  # callers' values are typed wider (int | Fraction | str) than they hold
    """Bytes as GB with two decimals: ``'68.98 GB'`` (GB = 1e9 bytes)."""
    return format_bytes(n_bytes, "GB")


def _divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def valid_layouts(model: ModelSpec, hardware: Hardware, workload: Workload, *,
                  tp_within_node: bool = True) -> list[Layout]:
    """Every layout :func:`~distcheck.plan.estimate.check_layout` accepts for ``hardware.gpus``.

    tp runs over the divisors of the GPU count that keep each tensor-parallel
    group inside a node (every divisor when ``tp_within_node`` is False); pp, cp and dp over the divisors of
    what is left
    (cp only with a model shape: it splits activations, which a raw count
    does not size);
    the ZeRO stages 0..3 wherever ``dp * cp > 1`` (with one replica there is
    nothing to shard, so only stage 0). Ordered by (tp, pp, cp, zero).
    """
    out = []
    gpus = hardware.gpus
    for tp in _divisors(gpus):
        if tp_within_node and tp > hardware.gpus_per_node:
            break
        for pp in _divisors(gpus // tp):
            for cp in (_divisors(gpus // (tp * pp)) if model.has_shape else [1]):
                dp = gpus // (tp * pp * cp)
                for zero in ((0, 1, 2, 3) if dp * cp > 1 else (0,)):
                    lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, zero=zero)
                    try:
                        check_layout(model, hardware, workload, lay, tp_within_node=tp_within_node)
                    except ConfigError:
                        continue
                    out.append(lay)
    return out


def rank_key(e: Estimate) -> tuple:
    """The sort key of the ranking (module docstring)."""
    lay = e.layout
    return (not e.fits, lay.lesson_step, lay.zero == 3, lay.tp * lay.pp * lay.cp, e.bubble_fraction, -lay.tp,
            lay.zero, e.comm_total, e.total)


#: the orders a plan's layouts can be listed in (``distcheck plan memory --sort``): name -> the rule, as printed
SORT_KEYS: dict[str, str] = {
    "lesson": "layouts that fit first; then the lesson's question (simplest strategy first); then ZeRO-0/1/2 "
              "before ZeRO-3; then the fewest GPUs per model replica (tp × pp × cp); then the smaller bubble; then "
              "the larger tp; then the lower ZeRO stage; then less communication; then fewer bytes per GPU",
    "memory": "layouts that fit first; then the fewest bytes per GPU (state + activations); ties in the lesson's "
              "order",
    "comm": "layouts that fit first; then the fewest bytes each GPU sends per step; ties in the lesson's order",
    "bubble": "layouts that fit first; then the smallest pipeline bubble; ties in the lesson's order",
}

_SORTS: dict[str, Callable[[Estimate], tuple]] = {
    "lesson": rank_key,
    "memory": lambda e: (not e.fits, e.total, rank_key(e)),
    "comm": lambda e: (not e.fits, e.comm_total, rank_key(e)),
    "bubble": lambda e: (not e.fits, e.bubble_fraction, rank_key(e)),
}


def sort_estimates(estimates: Sequence[Estimate], by: str = "lesson") -> tuple[Estimate, ...]:
    """``estimates`` in the order ``by`` names (a key of :data:`SORT_KEYS`, which states each rule).

    Raises ConfigError naming ``sort`` for an unknown order."""
    check_choice("sort", by, tuple(SORT_KEYS))
    return tuple(sorted(estimates, key=_SORTS[by]))


@dataclass(frozen=True)
class Question:
    """One question of the lesson's order and its answer.

    Attributes:
        step: 1..5 (keys of :data:`~distcheck.plan.inputs.LESSON_STEPS`).
        question: the question asked.
        answer: True when some layout of this kind fits.
        best: the best layout of this kind by :func:`rank_key` (fitting or not),
            None when no layout of this kind exists for the GPU count.
        reason: one line with the figures behind the answer.
    """

    step: int
    question: str
    answer: bool
    best: Estimate | None
    reason: str


@dataclass(frozen=True)
class Plan:
    """The result of :func:`plan`.

    Attributes:
        model, hardware, workload: the inputs.
        estimates: every valid layout, ranked (:func:`rank_key`).
        questions: the lesson's questions in order, each answered.
        recommended: the best layout of the first question answered yes; None when nothing fits.
        ddp_state: bytes per GPU of the training state under DDP (no split at all).
        smallest_split: the smallest TP × PP split (no ZeRO) whose state fits
            before activations, as ``(tp, pp, state bytes)``; None when none does.
        conventions: the conventions, one line each.
    """

    model: ModelSpec
    hardware: Hardware
    workload: Workload
    estimates: tuple[Estimate, ...]
    questions: tuple[Question, ...]
    recommended: Estimate | None
    ddp_state: int | Fraction
    smallest_split: tuple[int, int, int | Fraction] | None
    conventions: tuple[str, ...]

    def reasons(self) -> list[str]:
        """The recommendation with its reasons, one line each."""
        lines = []
        for q in self.questions:
            lines.append(f"{q.step}. {q.question} {'yes' if q.answer else 'no'}: {q.reason}")
            if q.answer:
                break
        return lines


def smallest_tp_pp_before_activations(estimates: list[Estimate]) -> tuple[int, int, int | Fraction] | None:
    """The smallest ``tp * pp`` among ZeRO-0 layouts without cp whose state fits (ties: the largest tp).

    This is the lesson's exercise ("the smallest TP × PP split ... that fits 80 GB
    before activations"); it matches :func:`distcheck.parallel.memory.min_tp_pp` restricted
    to the splits the GPU count allows.
    """
    best = None
    for e in estimates:
        lay = e.layout
        if lay.zero or lay.cp > 1 or not e.fits_before_activations:
            continue
        key = (lay.tp * lay.pp, -lay.tp)
        if best is None or key < best[0]:
            best = (key, (lay.tp, lay.pp, e.state))
    return None if best is None else best[1]


_QUESTIONS = {
    1: "Does the whole training state fit one GPU (DDP)?",
    2: "Does it fit with optimizer state and gradients sharded (ZeRO-1/2, the same communication as DDP)?",
    3: "Does it fit with everything sharded (ZeRO-3 / FSDP)?",
    4: "Does it fit with TP inside each node and PP across nodes?",
    5: "Does it fit with context parallelism added (long sequences; beyond the lesson's order)?",
}


def _describe(e: Estimate) -> str:
    acts = "" if e.activations is None else f" + {gb(e.activations)} activations"
    verdict = "fits" if e.fits else "does not fit"
    cap = e.hardware.usable_bytes
    extra = "" if e.layout.pp == 1 else f"; bubble {float(e.bubble_fraction):.1%}"
    return f"{e.layout.label}: {gb(e.state)} state{acts} = {gb(e.total)} per GPU, {verdict} {gb(cap)}{extra}"


def _answer(step: int, ranked: list[Estimate], hardware: Hardware) -> Question:
    kind = [e for e in ranked if e.layout.lesson_step == step]
    if not kind:
        why = {
            2: "one model replica: nothing to shard" if hardware.gpus == 1 else "no such layout",
            3: "one model replica: nothing to shard" if hardware.gpus == 1 else "no such layout",
            4: "no TP or PP degree > 1 divides the model and the GPU count",
            5: "no cp > 1 divides the sequence length and the GPU count",
        }.get(step, "no such layout")
        return Question(step, _QUESTIONS[step], False, None, why)
    best = kind[0]
    if best.fits:
        reason = _describe(best)
        if best.layout.zero in (1, 2) and step == 2:
            reason += " (ZeRO-1 and ZeRO-2 send the same bytes as DDP)"
        if best.layout.zero == 3:
            reason += f"; ZeRO-3 sends {gb(best.comm['dp'])} per GPU per step"
    else:
        reason = "best is " + _describe(best)
    if step == 4 and best.layout.pp == 1:
        reason += " (TP alone: no PP across nodes)"
    return Question(step, _QUESTIONS[step], best.fits, best, reason)


def plan(model: ModelSpec, hardware: Hardware, workload: Workload, *,
         on_progress: Callable[[int, int], None] | None = None) -> Plan:
    """Size every valid layout of ``model`` on ``hardware`` and walk the lesson's questions.

    Args:
        model, hardware, workload: the inputs (:mod:`distcheck.plan.estimate`).
        on_progress: called as ``on_progress(done, total)`` after each layout.

    Returns:
        A :class:`Plan`: the layouts ranked, the answered questions and the
        recommendation (None when no layout fits with its activations).

    Raises:
        ConfigError: when no layout exists for the GPU count and model, or when
        the model cannot fit at all: even its training state, fully sharded
        over every GPU, exceeds a GPU's usable memory (the message gives the
        fewest GPUs that could hold it, ``distcheck.parallel.memory.min_gpus``).
    """
    layouts = valid_layouts(model, hardware, workload)
    if not layouts:
        raise ConfigError("gpus", hardware.gpus, f"admits no layout of {model.name}: no tp dividing the heads and "
                                                 f"gpus_per_node={hardware.gpus_per_node}, with pp dividing the layers")
    estimates = []
    for i, lay in enumerate(layouts):
        estimates.append(estimate(model, hardware, workload, lay))
        if on_progress is not None:
            on_progress(i + 1, len(layouts))
    full_state = memory_ref.train_state_bytes(model.params, workload.convention)
    least = min(e.state for e in estimates)
    if least > hardware.usable_bytes:
        need = memory_ref.min_gpus(full_state, hardware.usable_bytes)
        raise ConfigError("model", model.name,
                          f"cannot fit {hardware.gpus} GPUs of {gb(hardware.gpu_memory)} in any layout: its training "
                          f"state is {gb(full_state)} ({workload.bytes_per_param}), at least {gb(least)} per GPU even "
                          f"fully sharded; it needs at least {need} GPUs before activations")
    ranked = sorted(estimates, key=rank_key)
    questions = tuple(_answer(step, ranked, hardware) for step in sorted(LESSON_STEPS))
    recommended = next((q.best for q in questions if q.answer), None)
    return Plan(
        model=model, hardware=hardware, workload=workload, estimates=tuple(ranked), questions=questions,
        recommended=recommended, ddp_state=full_state,
        smallest_split=smallest_tp_pp_before_activations(ranked),
        conventions=tuple(conventions(model, workload)),
    )


def layout_groups(tp: int, pp: int, dp: int, cp: int, gpus_per_node: int) -> dict[str, list[list[int]]]:
    """The rank groups of each axis of degree > 1 (:func:`distcheck.parallel.layout.groups`, default order)."""
    cfg = layout_ref.ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, gpus_per_node=gpus_per_node)
    return {axis: layout_ref.groups(cfg, axis) for axis in ("tp", "cp", "pp", "dp") if cfg.degree(axis) > 1}
