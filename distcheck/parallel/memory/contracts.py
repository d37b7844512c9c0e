"""Memory-estimator contracts: a planner's or a framework's bytes per GPU against the ZeRO paper's accounting.

The target is an :class:`~distcheck.parallel.memory.estimators.Estimator` (one ZeRO stage) or an
:class:`~distcheck.parallel.memory.estimators.EstimatorFamily` (one library's estimators across stages).
Neither needs a process group (``needs_world = False``): every example runs in the calling
process, and the figures are exact (integers and Fractions; the "dtype" is ``exact``).

``memory-estimator``, over Hypothesis-drawn (P, N, options) with P <= 1e13 and N <= 2**20:

* ``fit``: the exact fit of the estimator at the drawn options, ``a·P + b·P/N + c``
  (:func:`~distcheck.parallel.memory.estimators.fit`), is the split of a documented convention at its
  stage (ZeRO paper, Rajbhandari et al. 2020, Figure 1: stage 1 shards the optimizer state,
  stage 2 also the gradients, stage 3 also the weights); when the estimator gives its
  components, they match that convention one by one. A pass names the conventions; a failure
  says that none reproduces the fit and whether the total is the sum or the maximum of its
  components, and names the conventions that reproduce it exactly at another ZeRO stage
  (:func:`other_stages`: ``matches convention K = 12 (...) at ZeRO stage 1, not the declared stage 2``),
  the estimator then sharding what that stage shards.
* ``truncation``: the figure at (P, N) is within a byte of the fit (rounding to whole bytes
  costs less than a byte per rank, and the figures really are of the fitted form), and the
  options change only the constant.
* ``monotone_n``: more data-parallel ranks never need more bytes per GPU (skipped for an
  estimate that does not depend on N).
* ``printed_unit``: the printed figure is the bytes in the unit it names (GB = 1e9 bytes); one
  that is really bytes / 2**30 is named "GiB printed as GB" (skipped for an estimator that
  prints nothing).

``memory-estimator-stages``, over (P, N, options) drawn from the highest stage's estimator:

* ``baseline_n1``: at N = 1 nothing is sharded, so every stage gives the same bytes;
* ``stage_order``: a higher stage never needs more bytes at the same (P, N, options).

Adapters for DeepSpeed's ZeRO estimators and accelerate's training estimate are in
:mod:`distcheck.libs.targets` (``distcheck certify distcheck.libs.targets.deepspeed:ZERO2
--contract memory-estimator``); ``distcheck libs`` runs them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from typing import Any

from hypothesis import strategies as st

from distcheck.engine.contracts.contract import EXACT, Contract, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, require_distribution, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.memory.estimators import (
    BINARY_READING,
    DECIMAL_UNITS,
    MAX_RANKS_DRAWN,
    Estimator,
    EstimatorFamily,
    Fit,
    components_per_param,
    conventions_for,
    describe_fit,
    fit,
    number,
    read_printed,
)

__all__ = ["EstimatorCase", "MemoryEstimatorContract", "MemoryStagesContract", "other_stages"]


@dataclass(frozen=True)
class EstimatorCase:
    """One drawn example: ``params`` P, ``n`` data-parallel ranks, the estimator's ``options``, and
    ``more_ranks`` (the second N of ``monotone_n`` is ``n + more_ranks``)."""

    params: int
    n: int
    options: dict
    more_ranks: int = 1

    def where(self, *, n: bool = True) -> str:
        """``"P=1, N=2, largest_layer_params=1"`` (N left out with ``n=False``)."""
        head = f"P={self.params}" + (f", N={self.n}" if n else "")
        return head + "".join(f", {k}={v}" for k, v in self.options.items())


def _cases(est: Estimator) -> st.SearchStrategy[EstimatorCase]:
    more = st.integers(1, MAX_RANKS_DRAWN) if est.depends_on_n else st.just(1)
    return est.draws().flatmap(lambda t: more.map(lambda k: EstimatorCase(t[0], t[1], t[2], k)))


def _resolve(obj: Any, ref: str | None, kind: type, what: str) -> Target:
    if not isinstance(obj, kind):
        raise ProtocolError("target", ref or repr(obj),
                            f"must be a distcheck.parallel.memory.estimators.{kind.__name__} "
                            f"({what}; see docs/CERTIFY.md)")
    named: Any = obj  # an Estimator, EstimatorFamily, LayoutTarget or ProbeSet: each has a name and a distribution
    require_distribution(ref or named.name, named.distribution)
    return make_target(obj, ref or f"{kind.__name__}({named.name!r})", kind.__name__, distribution=named.distribution)


class MemoryEstimatorContract(Contract):
    """Bytes per GPU of one ZeRO stage, fitted, named and checked (module docstring)."""

    name = "memory-estimator"
    min_world_size = 1
    min_world_reason = ("runs in this process: the cases draw P and the data-parallel N (up to MAX_RANKS_DRAWN), "
                        "whatever the world")
    parallelism = "zero"
    summary = ("a memory estimator's bytes per GPU fit a·P + b·P/N + c with (a, b) a documented convention, within "
               "a byte, never growing with N, printed in the unit it names")
    properties = (
        PropertySpec("fit", "the exact fit a·P + b·P/N + c is the (replicated, sharded) split of a documented "
                            "convention at the estimator's ZeRO stage (components, when given, match it)", "exact"),
        PropertySpec("truncation", "every figure is within a byte of the fit, and the options change only its "
                                   "constant", "exact"),
        PropertySpec("monotone_n", "more data-parallel ranks never need more bytes per GPU", "exact"),
        PropertySpec("printed_unit", "the printed figure is the bytes in the unit it names (GB = 1e9 bytes)", "exact"),
    )
    dtypes = (EXACT,)
    needs_world = False

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        return _resolve(obj, ref, Estimator, "one ZeRO stage's bytes per GPU"), options

    def skipped(self, target: Any, options: dict) -> dict[str, str]:
        est = resolve(target)
        out = {}
        if not est.depends_on_n:
            out["monotone_n"] = f"{est.name} does not depend on N (no data parallelism)"
        if est.printed is None:
            out["printed_unit"] = f"{est.name} prints no figure"
        return out

    def cases(self, world_size: int, dtype: str, options: dict) -> None:  # they depend on the estimator: cases_for
        return None

    def cases_for(self, target: Any, world_size: int, dtype: str,
                  options: dict) -> st.SearchStrategy[EstimatorCase]:
        return _cases(resolve(target))

    def run_rank(self, ctx: RankContext, target: Any, case: EstimatorCase, dtype: str,
                 options: dict) -> dict[str, Any]:
        est: Estimator = resolve(target)
        p, n, opts = case.params, case.n, case.options
        return {
            "fit": fit(est, opts), "base": fit(est, est.fit_options),
            "components": components_per_param(est, opts),
            "base_components": components_per_param(est, est.fit_options),
            "value": est.evaluate(p, n, opts),
            "more": est.evaluate(p, n + case.more_ranks, opts) if est.depends_on_n else None,
            "printed": est.printed(p, n, opts) if est.printed is not None else None,
            "stage": est.stage, "fit_options": dict(est.fit_options),
        }

    def check(self, case: EstimatorCase, results: list, world_size: int, dtype: str,
              options: dict) -> dict[str, Outcome]:
        r = results[0]
        f, base = r["fit"], r["base"]
        text, convs = describe_fit(r["stage"], f, r["components"], case.options)
        note, _ = describe_fit(r["stage"], base, r["base_components"], r["fit_options"])
        if not convs:
            text += other_stages(r["stage"], f, r["components"])
        out = {"fit": Outcome(bool(convs), message=text, note=note)}

        got, want = r["value"], f.predict(case.params, case.n)
        if (f.replicated, f.sharded) != (base.replicated, base.sharded):
            out["truncation"] = Outcome(False, message=f"{case.where()}: the fit changes with the options: "
                                                       f"{f.describe()} instead of {base.describe()}")
        else:
            out["truncation"] = Outcome(
                abs(got - want) < 1, max_error=float(abs(got - want)), bound=1.0,
                note=f"every figure is {base.describe()} to within a byte",
                message=f"{case.where()}: the estimator gives {number(got)} bytes, {f.describe()} gives "
                        f"{number(want)}: off by {float(got - want):+g} bytes (at least a byte per rank)")
        if r["more"] is not None:
            n2 = case.n + case.more_ranks
            out["monotone_n"] = Outcome(r["more"] <= got, message=f"{case.where(n=False)}: N={case.n} gives "
                                                                  f"{number(got)} bytes but N={n2} gives more, "
                                                                  f"{number(r['more'])}")
        if r["printed"] is not None:
            out["printed_unit"] = _printed_outcome(case, got, r["printed"])
        return out


def other_stages(stage: int, f: Fit, components: Mapping[str, Fraction] | None) -> str:
    """``"; matches convention ... at ZeRO stage s, not the declared stage t: ..."`` for every (convention, other
    stage) whose (replicated, sharded) split is ``f``'s exactly (and whose components match, when given); "" when
    none does."""
    found = [(s, c) for s in range(4) if s != stage for c in conventions_for(s, f, components)]
    if not found:
        return ""
    named = "; or ".join(f"{c.describe()} at ZeRO stage {s}" for s, c in found)
    stages = sorted({s for s, _ in found})
    return (f"; matches convention {named}, not the declared stage {stage}: the estimator shards what stage "
            f"{' or '.join(map(str, stages))} shards (certify it with Estimator(..., stage={stages[0]}) if that is "
            f"the stage it estimates)")


def _printed_outcome(case: EstimatorCase, value: Fraction, text: str) -> Outcome:
    figure, half, unit = read_printed(text)
    # a printed figure rounded to its last digit (Python's format rounds the exact binary value)
    if abs(value / DECIMAL_UNITS[unit] - figure) <= half:
        return Outcome(True)
    shown = f"{case.where()}: {number(value)} bytes printed as '{text.strip()}'"
    if unit in BINARY_READING and abs(value / BINARY_READING[unit][0] - figure) <= half:
        size, mistake = BINARY_READING[unit]
        decimal = DECIMAL_UNITS[unit]
        shown += (f", which is bytes / 2**{size.bit_length() - 1}: {mistake} ({unit} = 1e{len(str(decimal)) - 1} "
                  f"bytes gives {float(value / decimal):.2f} {unit})")
    return Outcome(False, message=shown)


class MemoryStagesContract(Contract):
    """One library's estimators across ZeRO stages: one baseline at N = 1, never more bytes for a
    higher stage (module docstring)."""

    name = "memory-estimator-stages"
    min_world_size = 1
    min_world_reason = ("runs in this process: the cases draw P and the data-parallel N (up to MAX_RANKS_DRAWN), "
                        "whatever the world")
    parallelism = "zero"
    summary = "a library's ZeRO estimators agree at N = 1 and never need more bytes at a higher stage"
    properties = (
        PropertySpec("baseline_n1", "at N = 1 nothing is sharded: every stage gives the same bytes", "exact"),
        PropertySpec("stage_order", "a higher ZeRO stage never needs more bytes at the same (P, N, options)", "exact"),
    )
    dtypes = (EXACT,)
    needs_world = False

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        return _resolve(obj, ref, EstimatorFamily, "estimators of two or more ZeRO stages"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> None:  # they depend on the estimators: cases_for
        return None

    def cases_for(self, target: Any, world_size: int, dtype: str,
                  options: dict) -> st.SearchStrategy[EstimatorCase]:
        top = resolve(target).by_stage[-1]
        return top.draws().map(lambda t: EstimatorCase(t[0], t[1], t[2]))

    def run_rank(self, ctx: RankContext, target: Any, case: EstimatorCase, dtype: str,
                 options: dict) -> list[dict[str, Any]]:
        family: EstimatorFamily = resolve(target)
        p, n, opts = case.params, case.n, case.options
        return [{"name": e.name, "stage": e.stage, "n1": e.evaluate(p, 1, opts), "n": e.evaluate(p, n, opts),
                 "fit": fit(e, opts)} for e in family.by_stage]

    def check(self, case: EstimatorCase, results: list, world_size: int, dtype: str,
              options: dict) -> dict[str, Outcome]:
        stages = results[0]
        names = ", ".join(f"{s['name']} (stage {s['stage']})" for s in stages)
        one = EstimatorCase(case.params, 1, case.options)
        shown = ", ".join(f"{s['name']} {number(s['n1'])} bytes (= {number(s['fit'].replicated + s['fit'].sharded)}·P"
                          + (f" + {number(s['fit'].constant)}" if s["fit"].constant else "") + ")" for s in stages)
        out = {"baseline_n1": Outcome(len({s["n1"] for s in stages}) == 1, note=names,
                                      message=f"{one.where()}: nothing is sharded, yet the stages differ: {shown}")}
        higher = [(lo, hi) for lo, hi in pairwise(stages) if hi["n"] > lo["n"]]
        message = ""
        if higher:
            lo, hi = higher[0]
            message = (f"{case.where()}: stage {hi['stage']} ({hi['name']}) needs {number(hi['n'])} bytes, more than "
                       f"stage {lo['stage']} ({lo['name']}), {number(lo['n'])}")
        out["stage_order"] = Outcome(not higher, message=message, note=names)
        return out

