"""How fast ``distcheck certify`` runs examples, against what bounds it. Prints one table.

    python benchmarks/bench_certify.py                 # world sizes 2 and 4
    python benchmarks/bench_certify.py --examples 300 --spawn-examples 2

Rows, each measured in this run (a script, not a timed test; rates on a warm pool):

* **certify, gloo**: examples per second through the engine (Hypothesis drawing in the parent,
  every example on every rank of one persistent gloo pool), one example per world step and
  ``--batch`` examples per step:
  - a one-collective property: each rank's gradient averaged with one all-reduce, checked
    bitwise (a data-parallel mean), against the **raw gloo all-reduce** rate of the same
    tensor, all-reduced in a loop inside the ranks (target >= 80%);
  - ``row-parallel-linear`` on ``examples.my_tp_layers:RowParallelLinear`` with its input
    already split (one all-reduce forward, none backward), against the same raw rate and
    against a **fresh spawned world per example** (what a harness that spawns per test pays;
    target >= 400x).
* **the body alone**: the data-parallel property's own rank-side work (build the tensor, all-reduce,
  divide, back to numpy) looped inside the ranks, with no engine: the rate no harness can beat.
* **before / after**: the data-parallel contract draws its arrays per entry
  (``hypothesis.extra.numpy``, the "before" rows) or as one byte string per array
  (``distcheck.engine.strategies.draw_ints_from_bytes``), in the same run.
* **certify, threaded**: the data-parallel mean on the threaded backend (target >= 1,000
  examples/s at world size 4).
* **harness overhead**: one row-parallel example at 512 x 512 in float64 through the engine,
  against the bare computation of the same example (build the shards, forward, backward,
  return the results, compare with numpy in the parent; target <= 1.2x).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hypothesis import strategies as st  # noqa: E402

from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec  # noqa: E402
from distcheck.engine.contracts.targets import make_target  # noqa: E402

ROW = "examples.my_tp_layers:RowParallelLinear"


# ----------------------------------------------------------------------------- a data-parallel contract


def allreduce_mean(ctx, grad):
    """The target: average a gradient over the data-parallel ranks (one all-reduce)."""
    import torch.distributed as dist

    dist.all_reduce(grad)
    return grad / ctx.world_size


@dataclass(frozen=True)
class DPCase:
    grads: np.ndarray  # (world_size, n): rank r's gradient in row r


class DataParallelMean(Contract):
    """Each rank's gradient, averaged with one all-reduce, equals the mean of all of them (bitwise:
    integer entries, a power-of-two world)."""

    name = "bench-dp-mean"
    min_world_size = 2
    min_world_reason = "one rank has nothing to average: its gradient is its own mean"
    parallelism = "dp"
    summary = "gradient averaged over the ranks"
    dtypes = ("float64",)
    properties = (PropertySpec("mean", "every rank holds the mean gradient, bit for bit", "bitwise"),)
    options = (Option("arrays", "bytes", str, "how the gradients are drawn: bytes (one byte string per array, "
                                               "distcheck.engine.strategies.draw_ints_from_bytes) or entries "
                                               "(hypothesis.extra.numpy, one draw per explicit entry)",
                      ("bytes", "entries")),)

    def resolve(self, obj, ref, options):
        return make_target(obj, ref, "function"), options

    def cases(self, world_size, dtype, options):
        from distcheck import strategies as ds
        from distcheck.engine.strategies import draw_ints_from_bytes

        if options["arrays"] == "entries":
            return st.builds(DPCase, ds.integer_valued_arrays(shape=(world_size, 8), max_magnitude=64))
        return st.builds(DPCase, st.composite(lambda draw: draw_ints_from_bytes(draw, (world_size, 8), 64))())

    def run_rank(self, ctx, target, case, dtype, options):
        import torch

        from distcheck.engine.contracts.targets import resolve

        grad = torch.tensor(case.grads[ctx.rank], dtype=torch.float64)
        return resolve(target)(ctx, grad).numpy()

    def check(self, case, results, world_size, dtype, options):
        want = case.grads.sum(axis=0) / world_size
        bad = [r for r, got in enumerate(results) if not np.array_equal(got, want)]
        return {"mean": Outcome(not bad, message=f"ranks {bad} differ", ranks=tuple(bad))}


# ----------------------------------------------------------------------------- rank functions


def raw_allreduce(ctx, numel: int, repeats: int) -> float:
    """Seconds for ``repeats`` all-reduces of ``numel`` float64, timed inside the rank."""
    import torch
    import torch.distributed as dist

    t = torch.ones(numel, dtype=torch.float64)
    dist.all_reduce(t)  # warm the connection
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    return time.perf_counter() - start


def body_loop(ctx, grads) -> float:
    """Seconds for the data-parallel property's own rank-side work on every case of ``grads``, in a loop
    inside the rank (no engine, no Hypothesis, no round trip): what the engine's rate is bounded by."""
    import torch

    start = time.perf_counter()
    for g in grads:
        allreduce_mean(ctx, torch.tensor(g[ctx.rank], dtype=torch.float64)).numpy()
    return time.perf_counter() - start


def bare_row_parallel(ctx, x, weight, g):
    """The bare computation of one row-parallel example: this rank's shard, forward, backward."""
    import torch

    from examples.my_tp_layers import RowParallelLinear

    n = weight.shape[1] // ctx.world_size
    layer = RowParallelLinear(weight.shape[1], weight.shape[0], bias=False, input_is_parallel=True).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight[:, ctx.rank * n:(ctx.rank + 1) * n]))
    xs = torch.from_numpy(x[:, ctx.rank * n:(ctx.rank + 1) * n]).clone().requires_grad_(True)
    out = layer(xs)
    out.backward(torch.from_numpy(g))
    return out.detach().numpy(), xs.grad.numpy(), layer.weight.grad.numpy()


# ----------------------------------------------------------------------------- measurements


def rate_certify(pool, target, contract, examples: int, **kw) -> float:
    """Examples per second of one certification on a warm pool (a short run first loads the closed
    forms, the target's module on the ranks and Hypothesis' machinery, once per process)."""
    from distcheck.certify.engine import certify

    certify(target, contract, pool=pool, examples=5, seed=2, profile="ci", **kw)
    start = time.perf_counter()
    cert = certify(target, contract, pool=pool, examples=examples, seed=1, profile="ci", **kw)
    seconds = time.perf_counter() - start
    if not cert.ok:
        raise SystemExit(cert.report())
    return max(v.examples for v in cert.verdicts) / seconds


def rate_raw(pool, numel: int, repeats: int) -> float:
    return repeats / max(pool.run(raw_allreduce, numel, repeats))


def rate_body(pool, examples: int) -> float:
    grads = np.random.default_rng(0).integers(-64, 65, (examples, pool.world_size, 8)).astype(np.float64)
    pool.run(body_loop, grads[:5])
    return examples / max(pool.run(body_loop, grads))


def rate_spawn(world_size: int, examples: int) -> float:
    from distcheck.certify.engine import run_example
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.runners import RankPool

    contract = get_contract("row-parallel-linear")
    options = contract.parse_options({"input_is_parallel": True})
    target, options = contract.resolve(*_import(ROW), options)
    case = _row_case(world_size, 8)
    start = time.perf_counter()
    for _ in range(examples):
        with RankPool(world_size, backend="gloo", start_method="spawn", timeout_s=300) as pool:
            run_example(pool, contract, target, case, "float64", options)
    return examples / (time.perf_counter() - start)


def _import(ref):
    from distcheck.engine.contracts.targets import import_target

    return import_target(ref)


def _row_case(world_size: int, width: int, batch: int = 4, seed: int = 0):
    from distcheck.engine.contracts.sharded import TPCase

    rng = np.random.default_rng(seed)
    w = rng.integers(-8, 9, (width, width)).astype(np.float64)
    return TPCase(tp=world_size, x=rng.integers(-8, 9, (batch, width)).astype(np.float64), params={"weight": w},
                  grad_output=rng.integers(-8, 9, (batch, width)).astype(np.float64),
                  dims={"in_features": width, "out_features": width})


def overhead(pool, repeats: int) -> tuple[float, float]:
    """(seconds per 512 x 512 example through the engine, seconds for the bare computation)."""
    from distcheck.certify.engine import run_example
    from distcheck.engine.contracts.contract import get_contract

    contract = get_contract("row-parallel-linear")
    options = contract.parse_options({"input_is_parallel": True})
    target, options = contract.resolve(*_import(ROW), options)
    case = _row_case(pool.world_size, 512, batch=512)
    engine, bare = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outcome = run_example(pool, contract, target, case, "float64", options)
        engine.append(time.perf_counter() - start)
        assert all(o.ok for o in outcome.values())
        start = time.perf_counter()
        results = pool.run(bare_row_parallel, case.x, case.params["weight"], case.grad_output)
        w, x, g = case.params["weight"], case.x, case.grad_output
        want_out, want_dx, want_dw = x @ w.T, g @ w, g.T @ x
        n = w.shape[1] // pool.world_size
        for r, (out, dx, dw) in enumerate(results):
            assert np.array_equal(out, want_out)
            assert np.array_equal(dx, want_dx[:, r * n:(r + 1) * n])
            assert np.array_equal(dw, want_dw[:, r * n:(r + 1) * n])
        bare.append(time.perf_counter() - start)
    return float(np.median(engine)), float(np.median(bare))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--examples", type=int, default=200, help="examples per certification (default 200)")
    parser.add_argument("--spawn-examples", type=int, default=2, help="examples through fresh spawned worlds")
    parser.add_argument("--overhead-repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16,
                        help="examples per world step in the batched rows (default 16)")
    args = parser.parse_args(argv)

    import torch  # noqa: F401 - loaded once, before any timing
    from rich.console import Console
    from rich.table import Table

    from distcheck.runners import RankPool

    table = Table(title=f"bench_certify: examples per second through the engine ({os.cpu_count()} CPUs)")
    for col in ("world size", "measurement", "rate or time", "against", "ratio", "target"):
        table.add_column(col, justify="left" if col in ("measurement", "against", "target") else "right")
    row_kw = dict(dtypes=["float64"], options={"input_is_parallel": True})
    b = args.batch
    for ws in args.world_sizes:
        entries = {"arrays": "entries"}
        with RankPool(ws, backend="gloo", timeout_s=300) as pool:
            dp_one_before = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples, options=entries)
            dp_batched_before = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples, batch=b,
                                             options=entries)
            dp_one = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples)
            dp_batched = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples, batch=b)
            raw = rate_raw(pool, 8, 4 * args.examples)
            body = rate_body(pool, 4 * args.examples)
            row_batched = rate_certify(pool, ROW, "row-parallel-linear", args.examples, batch=b, **row_kw)
            engine_s, bare_s = overhead(pool, args.overhead_repeats)
        spawn = rate_spawn(ws, args.spawn_examples)
        with RankPool(ws, backend="threaded", timeout_s=300) as pool:
            threaded_before = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples, batch=b,
                                           options=entries)
            threaded = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples)
            threaded_b = rate_certify(pool, allreduce_mean, DataParallelMean(), args.examples, batch=b)
        against = f"raw gloo all-reduce {raw:,.0f}/s"
        table.add_row(str(ws), "the data-parallel property's body alone, looped inside the ranks (no engine)",
                      f"{body:,.0f}/s", against, f"{body / raw:.0%}", "(the engine's ceiling)")
        for label, rate in (("data-parallel mean, 1 per step, arrays by entries (before)", dp_one_before),
                            (f"data-parallel mean, {b} per step, arrays by entries (before)", dp_batched_before),
                            ("data-parallel mean, 1 per step, arrays from bytes", dp_one),
                            (f"data-parallel mean, {b} per step, arrays from bytes", dp_batched),
                            (f"row-parallel layer, {b} per step", row_batched)):
            share = f"{rate / raw:.0%} ({rate / body:.0%} of the body)" if "mean" in label else f"{rate / raw:.0%}"
            table.add_row(str(ws), f"certify, gloo: {label}", f"{rate:,.0f}/s", against, share, ">= 80%")
        table.add_row(str(ws), f"certify, gloo: row-parallel layer, {b} per step", f"{row_batched:,.0f}/s",
                      f"fresh spawned world per example {spawn:.2f}/s", f"{row_batched / spawn:,.0f}x", ">= 400x")
        for label, rate in ((f"{b} per step, arrays by entries (before)", threaded_before),
                            ("1 per step, arrays from bytes", threaded),
                            (f"{b} per step, arrays from bytes", threaded_b)):
            table.add_row(str(ws), f"certify, threaded: data-parallel mean, {label}", f"{rate:,.0f}/s", "-", "-",
                          ">= 1,000/s at 4 ranks")
        table.add_row(str(ws), "one 512x512 float64 row-parallel example", f"{engine_s * 1e3:.1f} ms",
                      f"bare computation {bare_s * 1e3:.1f} ms", f"{engine_s / bare_s:.2f}x", "<= 1.2x")
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
