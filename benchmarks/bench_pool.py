"""Examples per second: a persistent RankPool against a fresh world per example.

    python benchmarks/bench_pool.py                      # all-reduce property, world sizes 2 and 4
    python benchmarks/bench_pool.py --property ddp       # the DDP gradient check
    python benchmarks/bench_pool.py --world-sizes 2 4 8 --examples 300 --fresh-examples 3

For every world size it runs the same property side by side, in one process:

* ``pool gloo``: one persistent gloo world, one ``run`` per example;
* ``pool threaded``: the same on torch's threaded backend;
* ``fresh fork``: a new forked gloo world per example (start, run, close);
* ``fresh spawn``: a new *spawned* gloo world per example (what a harness that
  spawns per test does; the baseline).

The fresh-world modes are slow, so they run ``--fresh-examples`` examples only;
examples/second is what compares. A script, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def allreduce_property(ctx, seed):
    """One sub-example: all-reduce a seeded integer vector and check the sum exactly."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(seed * 1009 + ctx.rank)
    x = torch.randint(-1000, 1000, (64,), generator=g, dtype=torch.int64)
    expected = sum(torch.randint(-1000, 1000, (64,), generator=torch.Generator().manual_seed(seed * 1009 + r),
                                 dtype=torch.int64) for r in range(ctx.world_size))
    dist.all_reduce(x)
    if not torch.equal(x, expected):
        raise AssertionError("all-reduce sum is wrong")
    return True


def ddp_property(ctx, seed):
    """One example of the data-parallel reducer contract with torch's DDP (unequal shards)."""
    import numpy as np
    from torch.nn.parallel import DistributedDataParallel

    from distcheck.engine.contracts.targets import make_target
    from distcheck.parallel.dp.contracts import DataParallelReducer, DDPCase

    rng = np.random.default_rng(seed)
    n, d = ctx.world_size * 4 + 1, 4

    def draw(*shape):
        return rng.integers(-3, 4, size=shape).astype(np.float64)

    case = DDPCase("linear", draw(n, d), draw(n), {"w": draw(d)}, ctx.world_size, True)
    contract = DataParallelReducer()
    target = make_target(DistributedDataParallel, "torch.nn.parallel:DistributedDataParallel", "ddp")
    return contract.run_rank(ctx, target, case, "float64", contract.parse_options({}))["grads"]["w"].tolist()


def _time_pool(fn, world_size, backend, examples, start_method="fork"):
    from distcheck.runners import RankPool

    t0 = time.perf_counter()
    with RankPool(world_size, backend=backend, timeout_s=300, start_method=start_method,
                  preload=("torch._dynamo",)) as pool:
        for i in range(examples):
            pool.run(fn, i)
    return time.perf_counter() - t0


def _time_fresh(fn, world_size, examples, start_method):
    from distcheck.runners import RankPool

    t0 = time.perf_counter()
    for i in range(examples):
        with RankPool(world_size, timeout_s=300, start_method=start_method, preload=("torch._dynamo",)) as pool:
            pool.run(fn, i)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--examples", type=int, default=200, help="examples through each pool (default 200)")
    parser.add_argument("--fresh-examples", type=int, default=2, help="examples per fresh-world mode (default 2)")
    parser.add_argument("--property", choices=("allreduce", "ddp"), default="allreduce")
    parser.add_argument("--no-spawn", action="store_true", help="skip the (slow) spawn baseline")
    args = parser.parse_args(argv)

    import torch  # loaded once, before any timing
    import torch._dynamo  # noqa: F401
    from rich.console import Console
    from rich.table import Table

    fn = allreduce_property if args.property == "allreduce" else ddp_property
    table = Table(title=f"bench_pool: {args.property} property, examples per second ({os.cpu_count()} CPUs)")
    for col in ("world size", "mode", "examples", "seconds", "examples/s", "vs spawn"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for N in args.world_sizes:
        rows = [
            ("pool gloo", args.examples, _time_pool(fn, N, "gloo", args.examples)),
            ("pool threaded", args.examples, _time_pool(fn, N, "threaded", args.examples)),
            ("fresh fork", args.fresh_examples, _time_fresh(fn, N, args.fresh_examples, "fork")),
        ]
        if not args.no_spawn:
            rows.append(("fresh spawn", args.fresh_examples, _time_fresh(fn, N, args.fresh_examples, "spawn")))
        spawn_rate = rows[-1][1] / rows[-1][2] if not args.no_spawn else None
        for mode, n, secs in rows:
            rate = n / secs
            ratio = f"{rate / spawn_rate:,.0f}x" if spawn_rate else "-"
            table.add_row(str(N), mode, str(n), f"{secs:.2f}", f"{rate:,.1f}", ratio)
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
