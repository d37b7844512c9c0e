"""The ``training-step`` contract in float32 and bf16 mixed precision on torch's composition: every drawn case held
to the criterion of ``distcheck/parallel/step/precision.py``, and what the criterion's constants must be. Prints
one table per precision.

    python benchmarks/step_precision_margin.py                          # 40 examples per precision, 2 ranks
    python benchmarks/step_precision_margin.py --examples 1000 --world-size 2
    python benchmarks/step_precision_margin.py --examples 200 --world-size 4 --precisions bf16-fsdp

Each example is one certify example of ``examples.my_step:parallelize`` (FSDP2 with the layout's
``MixedPrecisionPolicy`` x torchtitan's tensor-parallel plan, every layout of the world size) on a gloo pool: the
run is the no-false-flag property at scale (its verdicts must all pass), and it measures, per precision, class of
composition (``tp = 1``: the micro-batch's arithmetic kept; ``tp > 1``) and kind of value:

* ``margin``: log2 of the worst ``error / bound`` under the contract's criterion (below 0: held; a value near 0
  is a false flag waiting to happen);
* ``own``: log2 of the worst single-device error ``|v_1 - v_64| / (u_compute (|v_64| + S_kind))``: the
  precision's own noise, in units of the compute dtype's roundoff;
* ``dp floor``: on ``tp = 1``, log2 of the worst ``(|v_p - v_64| - |v_1 - v_64|) / (u_reduce (|v_64| + S_kind))``:
  the floor c = 1 needs, in units of the reduce dtype's roundoff (the contract's is ``log2 FLOOR``);
* ``tp f@c``: on ``tp > 1``, for c = 1, 2, 4, 8, log2 of the worst ``(|v_p - v_64| - |v_1 - v_64| - (c - 1) E_1) /
  (u_compute (|v_64| + S_kind))``: the floor each c needs, in units of the compute dtype's roundoff (the
  contract's pair is ``C_TP`` and ``log2 FLOOR_TP``). The parameters' bound is carried from the moments' through
  AdamW, not set by c: their column is their margin only.

A script, not a timed test: it prints ratios, never seconds. ``tests/test_step_precision.py`` runs the same
property with fewer examples (a ``slow`` test).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from typing import Any, ClassVar

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distcheck.parallel.step import contracts as sc  # noqa: E402
from distcheck.parallel.step import precision as sp  # noqa: E402
from distcheck.parallel.step.bound import value_bound  # noqa: E402

CS = (1, 2, 4, 8)
KINDS = ("param", "exp_avg", "exp_avg_sq", "loss", "grad norm", "clip factor")
#: (precision, tp class, kind, measure) -> worst value seen
WORST: dict[tuple[str, str, str, str], float] = defaultdict(lambda: -math.inf)
#: the precision and composition class of the case being checked
NOW: dict[str, Any] = {}


def _kind(what: str) -> str:
    for moment in ("exp_avg_sq", "exp_avg"):
        if f"AdamW {moment} of" in what:
            return moment
    for scalar, kind in (("reported loss", "loss"), ("reported grad norm", "grad norm"),
                         ("clipping factor", "clip factor")):
        if scalar in what:
            return kind
    return "param"


def _keep(kind: str, measure: str, value: float) -> None:
    key = (NOW["precision"], NOW["class"], kind, measure)
    WORST[key] = max(WORST[key], value)


class Measuring(sc.TrainingStep):
    """The training-step contract, measuring (in the parent) every comparison its check makes."""

    shadows: ClassVar[list] = []

    def check(self, case: Any, results: list, world_size: int, dtype: str, options: dict) -> dict:
        NOW.update(precision=case.layout.precision, **{"class": "tp > 1" if case.layout.tp > 1 else "tp = 1"})
        Measuring.shadows.clear()
        out = super().check(case, results, world_size, dtype, options)
        if Measuring.shadows:
            self._needed(case, results, *Measuring.shadows[-1])
        return out

    @staticmethod
    def _needed(case: Any, results: list, shadow: list, single: list) -> None:
        prec = sp.get_precision(case.layout.precision)
        u_reduce, u_compute = sp.UNIT_ROUNDOFF[prec.reduce], sp.UNIT_ROUNDOFF[prec.compute]
        for s, (ref, one) in enumerate(zip(shadow, single, strict=True)):
            kinds = {"param": ({n: p for n, p in ref["params"].items()}, {n: p for n, p in one["params"].items()},
                               lambda rec, n: rec["params"].get(n))}
            for j, moment in enumerate(("exp_avg", "exp_avg_sq")):
                kinds[moment] = ({n: st[j] for n, st in ref["state"].items() if st[j] is not None},
                                 {n: st[j] for n, st in one["state"].items() if st[j] is not None},
                                 lambda rec, n, j=j: rec["state"].get(n, (None, None))[j])
            tensors: list[tuple[str, Any, Any, list, float]] = []
            for kind, (want, mine, pick) in kinds.items():
                scale = max((float(np.max(np.abs(v))) for v in want.values() if np.size(v)), default=0.0)
                for name, w in want.items():
                    got = [pick(res["steps"][s], name) for res in results]
                    tensors.append((kind, w, mine[name], [g for g in got if g is not None], scale))
            for kind, key in (("loss", "loss"), ("grad norm", "norm"), ("clip factor", "scale")):
                got = [res["steps"][s][key] for res in results]
                if key == "scale":
                    got = [ref[key] if g is None else g for g in got]
                tensors.append((kind, ref[key], one[key], got, 0.0))
            for kind, w, mine, got, scale in tensors:
                w = np.atleast_1d(np.asarray(w, np.float64))
                e1 = np.abs(np.atleast_1d(np.asarray(mine, np.float64)) - w)
                mag = np.abs(w) + scale
                top = float(e1.max()) if e1.size else 0.0
                with np.errstate(divide="ignore", invalid="ignore"):
                    _keep(kind, "own", float((e1 / np.maximum(u_compute * mag, 1e-300)).max()) if e1.size else 0.0)
                for g in got:
                    ep = np.abs(np.atleast_1d(np.asarray(g, np.float64)) - w)
                    if case.layout.tp == 1:
                        with np.errstate(divide="ignore", invalid="ignore"):
                            need = np.where(ep > e1, (ep - e1) / np.maximum(u_reduce * mag, 1e-300), 0.0)
                        _keep(kind, "dp floor", float(need.max()) if need.size else 0.0)
                    else:
                        for c in CS:
                            with np.errstate(divide="ignore", invalid="ignore"):
                                need = (ep - e1 - (c - 1) * top) / np.maximum(u_compute * mag, 1e-300)
                            _keep(kind, f"tp f@{c}", float(need.max()) if need.size else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=40, help="examples per precision (default 40)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--precisions", default="float32,bf16-fsdp,bf16-autocast")
    parser.add_argument("--layout", default="", help="pin the composition (the contract's layout option)")
    parser.add_argument("--target", default="examples.my_step:parallelize",
                        help="the target (default examples.my_step:parallelize; e.g. examples.my_gpt:TARGET)")
    parser.add_argument("--batch", type=int, default=4, help="examples per world step (default 4)")
    parser.add_argument("--loose-tp", action="store_true",
                        help="measure only: C_TP set to 2^20, so no tp case fails while the constants are measured")
    args = parser.parse_args(argv)
    if args.loose_tp:
        sp.C_TP = 2.0**20

    from distcheck.certify import certify

    spy = sc.precision_bounds

    def recording(shadow: Any, single: Any, *rest: Any, **kwargs: Any) -> Any:
        Measuring.shadows.append((shadow, single))
        return spy(shadow, single, *rest, **kwargs)

    sc.precision_bounds = recording  # type: ignore[assignment]
    within = sc._within

    def measured(what: str, ref: Any, got: list, ranks: Any = None, bound: Any = None, own: Any = None,
                 own_name: str = "") -> Any:
        e = np.atleast_1d(np.asarray(ref, dtype=np.float64))
        b = 2 * value_bound(e, 0.0) if bound is None else np.broadcast_to(np.asarray(bound, np.float64), e.shape)
        for g in got:
            if g is not None and np.shape(g) == np.shape(ref):
                ratio = np.abs(np.atleast_1d(np.asarray(g, dtype=np.float64)) - e) / np.maximum(b, 1e-300)
                _keep(_kind(what), "margin", float(ratio.max()) if ratio.size else 0.0)
        return within(what, ref, got, ranks, bound, own, own_name)

    sc._within = measured  # type: ignore[assignment]
    failed = 0
    for name in filter(None, (p.strip() for p in args.precisions.split(","))):
        prec = sp.get_precision(name)
        options = {"mixed_precision": name.removeprefix("bf16-")} if prec.dtype == "bfloat16" else {}
        if args.layout:
            options["layout"] = args.layout
        cert = certify(args.target, Measuring(), world_sizes=[args.world_size],
                       examples=args.examples, dtypes=[prec.dtype], options=options, timeout_s=900,
                       batch=args.batch)
        verdicts = ", ".join(f"{v.property} {v.verdict} ({v.examples})" for v in cert.verdicts)
        failed += sum(v.verdict != "pass" for v in cert.verdicts)
        print(f"\n{name}: {args.examples} examples of {args.target} at world size {args.world_size}; "
              f"verdicts: {verdicts}")
        for v in cert.verdicts:
            if v.verdict != "pass":
                print(f"  {v.property}: {v.failure}\n  case: {v.counterexample}")
        layouts = sorted({r.columns["layout"] for r in cert.compositions})
        print(f"layouts drawn: {'; '.join(layouts)}")
        measures = ("margin", "own", "dp floor", *(f"tp f@{c}" for c in CS))
        print(f"{'class':<8}{'kind':<13}" + "".join(f"{m:>10}" for m in measures))
        for cls in ("tp = 1", "tp > 1"):
            for kind in KINDS:
                cells = [WORST.get((name, cls, kind, m), -math.inf) for m in measures]
                if all(c == -math.inf for c in cells):
                    continue
                shown = ["-" if c == -math.inf else ("-inf" if c <= 0 else f"{math.log2(c):.1f}") for c in cells]
                print(f"{cls:<8}{kind:<13}" + "".join(f"{c:>10}" for c in shown))
    floors = ", ".join(f"{k} {math.log2(v):.0f}" for k, v in sp.FLOOR_TP.items())
    print(f"\ncontract: log2 FLOOR = {math.log2(sp.FLOOR):.0f}, C_TP = {sp.C_TP:g}, log2 FLOOR_TP = {floors}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
