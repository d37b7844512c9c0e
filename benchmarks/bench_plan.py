"""``distcheck plan memory`` and ``distcheck plan time`` beside ``python -c "import distcheck"``, wall and CPU time;
one table.

    python benchmarks/bench_plan.py             # 5 runs of each command, about a minute on 2 cores
    python benchmarks/bench_plan.py --runs 9

Each command runs in a fresh interpreter (as a user runs it), the commands in turn, ``--runs``
times, so that a burst of load on shared cores falls on all of them alike. Wall time is
``time.perf_counter`` around the child; CPU time (user + system) is the child's, from
``resource.getrusage(RUSAGE_CHILDREN)``. The table gives the median and the range of each,
and the plan's time less the import's. The last row is what ``plan memory`` loaded before
its closed forms were evaluated without sympy: sympy and the whole closed-form catalogue
(``distcheck.closed_form.catalogue()``), for comparison. Target (issue "distcheck plan answers
in about 1 s"): about 1 s of CPU for the plan; issue "Plan by time, not memory alone": ``plan time`` within 1 s
of CPU too (it times every layout that fits, TP across nodes included, at a fixed global batch).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = ["-m", "distcheck", "plan", "memory", "--model", "llama-3-70b", "--gpus", "64", "--gpus-per-node", "8",
        "--gpu-memory", "80GB"]
TIME = ["-m", "distcheck", "plan", "time", "--model", "llama-3-70b", "--gpus", "64", "--quiet"]
COMMANDS = (
    ('python -c "import distcheck"', ["-c", "import distcheck"]),
    ("distcheck plan memory --model llama-3-70b --gpus 64", PLAN),
    ("distcheck plan time --model llama-3-70b --gpus 64", TIME),
    ("sympy + the closed-form catalogue (before)", ["-c", "from distcheck.closed_form import catalogue; catalogue()"]),
)


def _run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh interpreter running ``args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(runs: int = 5) -> None:
    for _, args in COMMANDS:  # warm the file cache
        _run(args)
    walls: list[list[float]] = [[] for _ in COMMANDS]
    cpus: list[list[float]] = [[] for _ in COMMANDS]
    for _ in range(runs):
        for k, (_, args) in enumerate(COMMANDS):
            wall, cpu = _run(args)
            walls[k].append(wall)
            cpus[k].append(cpu)
    load = os.getloadavg()[0]
    print(f"{'command':<54} {'wall s, median (range)':>24} {'CPU s, median (range)':>24} {'CPU less import':>16}")
    base = statistics.median(cpus[0])
    for k, (label, _) in enumerate(COMMANDS):
        extra = "" if k == 0 else f"{statistics.median(cpus[k]) - base:16.2f}"
        print(f"{label:<54} {_cell(walls[k]):>24} {_cell(cpus[k]):>24} {extra:>16}")
    print(f"({runs} runs each, in turn; {os.cpu_count()} CPUs, load average {load:.1f})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each command (default 5)")
    ns = ap.parse_args()
    if ns.runs < 1:
        ap.error(f"--runs={ns.runs} must be an integer >= 1")
    main(ns.runs)
