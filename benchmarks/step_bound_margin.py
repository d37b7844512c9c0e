"""The margin of the ``training-step`` bound on torch's composition: for each step and kind of value, the largest
``error / bound`` over the drawn examples, in powers of two. Prints one table.

    python benchmarks/step_bound_margin.py                       # 40 examples, world size 4, every layout
    python benchmarks/step_bound_margin.py --examples 200 --world-size 2
    python benchmarks/step_bound_margin.py --one-token           # every sequence keeps one token, clip binds
    python benchmarks/step_bound_margin.py --axes all            # cp and ep drawn too (MoE layers, RoPE)

Each example is one certify example of ``examples.my_step:parallelize`` (FSDP2 x torchtitan's tensor-parallel
plan, every layout of the world size) on a gloo pool; every comparison the contract makes is also measured
here (its ``_within`` instrumented: the same reference, the same bound). A margin of -17 means the worst error
of that kind was 2^-17 of its bound; a value near 0 would be a false flag waiting to happen. ``--one-token``
draws the compositions in which values cancel exactly (the query and key projections' gradients are 0 with one
key per softmax). A script, not a timed test: it prints ratios, never seconds.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _kind(what: str) -> str:
    for moment in ("exp_avg_sq", "exp_avg"):
        if f"AdamW {moment} of" in what:
            return moment
    for scalar in ("reported loss", "reported grad norm", "clipping factor"):
        if scalar in what:
            return scalar
    return "param"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--one-token", action="store_true", help="every sequence keeps one token; clip binds")
    parser.add_argument("--axes", default="", help="the contract's axes option (all: cp and ep too)")
    args = parser.parse_args(argv)

    from distcheck.certify import certify
    from distcheck.parallel.step import contracts as sc
    from distcheck.parallel.step.bound import value_bound
    from distcheck.parallel.step.case import BINDING_MAX_NORM

    worst: dict[tuple[str, str], float] = defaultdict(float)
    within = sc._within

    def measured(what, ref, got, ranks=None, bound=None):  # type: ignore[no-untyped-def]
        e = np.atleast_1d(np.asarray(ref, dtype=np.float64))
        b = 2 * value_bound(e, 0.0) if bound is None else np.broadcast_to(np.asarray(bound, np.float64), e.shape)
        for g in got:
            if g is not None and np.shape(g) == np.shape(ref):
                ratio = np.abs(np.atleast_1d(np.asarray(g, dtype=np.float64)) - e) / np.maximum(b, 1e-300)
                key = (what.split()[1], _kind(what))
                worst[key] = max(worst[key], float(ratio.max()) if ratio.size else 0.0)
        return within(what, ref, got, ranks, bound)

    sc._within = measured
    if args.one_token:
        sc.TrainingStep.cases = lambda self, ws, dtype, options: sc._cases(  # type: ignore[method-assign]
            sc.allowed(ws, options), one_token=True, moe=sc.Axis.EP.value in sc.axes_option(options.get("axes", "")),
            max_norms=(BINDING_MAX_NORM,))
    cert = certify("examples.my_step:parallelize", "training-step", world_sizes=[args.world_size],
                   examples=args.examples, timeout_s=900, options={"axes": args.axes} if args.axes else None)
    kinds = sorted({k for _, k in worst})
    steps = sorted({s for s, _ in worst}, key=int)
    print(f"log2(worst error / bound), {args.examples} examples at world size {args.world_size}"
          + (", one kept token per sequence" if args.one_token else "") + (f", axes {args.axes}" if args.axes else ""))
    print(f"{'kind':<20}" + "".join(f"{'step ' + s:>10}" for s in steps))
    for k in kinds:
        cells = [worst.get((s, k)) for s in steps]
        print(f"{k:<20}" + "".join(f"{'-' if c is None else ('-inf' if c == 0 else f'{math.log2(c):.1f}'):>10}"
                                   for c in cells))
    print("verdicts:", ", ".join(f"{v.property} {v.verdict}" for v in cert.verdicts))
    return 0 if all(v.verdict == "pass" for v in cert.verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
