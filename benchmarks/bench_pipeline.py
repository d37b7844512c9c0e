"""Pipeline simulator cost against p * m * v, every schedule, with a linear fit; one table.

    python benchmarks/bench_pipeline.py            # about a minute on 2 cores
    python benchmarks/bench_pipeline.py --runs 9   # more runs per size (medians are reported)

For every schedule of ``distcheck.parallel.pp.SCHEDULES`` it times ``distcheck.parallel.pp.simulate``
(the order built as arrays, checked, simulated exactly, every figure computed; no tick grid)
at p = 8..64 ranks, m = 16 p micro-batches and v = 4 chunks per rank where the schedule
allows it (1 or 2 where its v is fixed), the lesson's costs t_f = 1, t_b = 2. Each size is run
``--runs`` times, the sizes in turn (so that a burst of load on the shared cores falls on all of
them alike); the table reports the median. The fit is least squares, time = a + b * (p m v),
with b in microseconds per (stage, micro-batch) pair and R^2. Target (the issue "Pipelines at
scale"): p = 64, m = 1024, v = 4 under 0.2 s for every schedule that allows those values.

The last column times the plain one-action-at-a-time replay (``distcheck.parallel.pp.plain``,
the simulator as first written, now the engine's oracle) on the p = 16, m = 256 order, once.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from distcheck.parallel.pp import SCHEDULES
from distcheck.parallel.pp.plain import plain_replay
from distcheck.parallel.pp.schedules import FIXED_V, order_arrays, simulate

SIZES = ((8, 128), (16, 256), (32, 512), (64, 512), (64, 1024))
TARGET_S = 0.2


def _plain(schedule: str, p: int, m: int, v: int) -> float:
    order = order_arrays(schedule, p, m, v)
    routes = (order.first_stage, order.last_stage) if order.first_stage is not None else None
    actions = order.to_actions(pairs=True)
    t0 = time.perf_counter()
    plain_replay(actions, order.num_stages, m, t_f=1, t_b=2, t_i=1, t_w=1, t_fb=3, routes=routes)
    return time.perf_counter() - t0


def main(runs: int = 5) -> None:
    head = f"{'schedule':<15} {'v':>2} " + " ".join(f"{f'p={p},m={m}':>13}" for p, m in SIZES)
    print(head + f" {'us/pair':>8} {'R^2':>6} {'< 0.2 s':>8} {'plain p=16,m=256':>17}")
    misses = []
    for s in SCHEDULES:
        v = FIXED_V.get(s, 4)
        xs = [p * m * v for p, m in SIZES]
        for p, m in SIZES:
            simulate(s, p, m, v)  # warm (imports, allocator)
        times: list[list[float]] = [[] for _ in SIZES]
        for _ in range(runs):  # round-robin over the sizes: a burst of load on the shared cores hits them all alike
            for k, (p, m) in enumerate(SIZES):
                gc.collect()
                t0 = time.perf_counter()
                simulate(s, p, m, v)
                times[k].append(time.perf_counter() - t0)
        ys = [statistics.median(t) for t in times]
        slope, intercept = np.polyfit(xs, ys, 1)
        pred = np.polyval([slope, intercept], xs)
        ss_res = float(((np.array(ys) - pred) ** 2).sum())
        r2 = 1 - ss_res / max(float(((np.array(ys) - np.mean(ys)) ** 2).sum()), 1e-30)
        ok = ys[-1] < TARGET_S
        if not ok:
            misses.append(s)
        plain = _plain(s, 16, 256, v)
        cells = " ".join(f"{y:13.3f}" for y in ys)
        print(f"{s:<15} {v:>2} {cells} {slope * 1e6:8.3f} {r2:6.3f} {'yes' if ok else 'NO':>8} {plain:16.2f}s")
    print(f"\nseconds, median of {runs} runs; p*m*v at the last size: {64 * 1024 * 4:,} (v = 4), "
          f"{64 * 1024 * 2:,} (v = 2), {64 * 1024:,} (v = 1)")
    print("target met for every schedule" if not misses else f"target missed: {', '.join(misses)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per size (the median is reported)")
    main(parser.parse_args().runs)
