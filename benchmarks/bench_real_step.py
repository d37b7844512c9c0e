"""torchtitan's Llama 3 under its own ``parallelize_llama`` at dp_shard = 2 x tp = 2: examples per second of the
``training-step`` certification against the same check written by hand, and the first-divergence replay (every
tensor recorded) against a plain step. Prints one table. Needs the libs extra (torchtitan).

    python benchmarks/bench_real_step.py                       # 3 examples, the small sizes distcheck libs runs
    python benchmarks/bench_real_step.py --model debugmodel    # torchtitan's debug model's own sizes (slow)

On one warm gloo pool of 4 ranks (each side's first example untimed, to load what the ranks import):

* **distcheck certify**: ``certify(distcheck.libs.targets.torchtitan_llama:LLAMA, "training-step", options=
  {"layout": "dp_shard=2,tp=2"})``: Hypothesis draws the micro-batches, lengths, clipping, learning rate and steps;
  every rank builds torchtitan's model, parallelizes it with ``parallelize_llama``, steps, gathers every parameter
  and AdamW moment (each array shipped once: distcheck.parallel.step.records); rank 0 runs the float64 reference
  and checks every rank's values against their bounds; the parent gets the outcomes.
* **by hand**: the same cases (as plain numbers) written out in plain torch and torchtitan, with no distcheck in
  the loop: four processes (``torch.multiprocessing``, ``fork``, ``init_process_group("gloo")``), the model built
  by the same torchtitan calls, the adapter's ``parallelize`` (torchtitan's ``parallelize_llama`` with the CPU
  substitutions, what a user's own check would call), data, loss (token sum / global tokens), backward,
  torchtitan's ``clip_grad_norm_``, AdamW, every parameter and moment gathered with ``full_tensor()``; rank 0 steps
  the single-device float64 model and compares (``torch.allclose``). Timed inside the ranks.
* **plain step** and **recorded replay**: the certify side's cases run again on the pool as one example each,
  ``run_step(..., record=False)`` (the step, the gathering and rank 0's reference: what every example costs) and
  ``record=True`` (every module's output, input gradient and parameter gradient recorded on every rank, the
  reference recorded too: what the replay of a failure costs, once per failing property).

The ratios: certify's seconds per example over the hand-written one's, the recorded replay's over the plain
step's. A script, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any, ClassVar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distcheck.parallel.step.contracts import TrainingStep  # noqa: E402

LAYOUT = "dp_shard=2,tp=2"
WORLD = 4
ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
TARGETS = {"small": "distcheck.libs.targets.torchtitan_llama:LLAMA",
           "debugmodel": "distcheck.libs.targets.torchtitan_llama:LLAMA_DEBUGMODEL"}


class Recording(TrainingStep):
    """The training-step contract, keeping (in the parent) every case it checks."""

    seen: ClassVar[list] = []

    def check(self, case: Any, results: list, world_size: int, dtype: str, options: dict) -> dict:
        Recording.seen.append(case)
        return super().check(case, results, world_size, dtype, options)


def timed_step(ctx: Any, target: Any, case: Any, record: bool) -> float:
    """One example's step on this rank (``run_step``), its seconds measured between two barriers."""
    import torch.distributed as dist

    from distcheck.parallel.step.harness import run_step

    dist.barrier()
    t0 = time.perf_counter()
    run_step(ctx, target, case, record=record)
    dist.barrier()
    return time.perf_counter() - t0


def run_distcheck(ref: str, examples: int) -> tuple[list, float, float, float]:
    """The certify side and the replay: the cases drawn, certify's seconds, the plain steps' and the recorded
    replays' seconds over the same cases."""
    from distcheck.certify import certify
    from distcheck.engine.contracts.targets import import_target
    from distcheck.libs.targets.torchtitan_llama import PRELOAD
    from distcheck.runners import RankPool

    target = import_target(ref)[0]
    with RankPool(WORLD, backend="gloo", timeout_s=600, preload=PRELOAD) as pool:
        certify(ref, Recording(), pool=pool, examples=1, seed=1, options={"layout": LAYOUT}).assert_certified()
        Recording.seen.clear()
        t0 = time.perf_counter()
        cert = certify(ref, Recording(), pool=pool, examples=examples, seed=0, options={"layout": LAYOUT})
        certify_s = time.perf_counter() - t0
        cert.assert_certified()
        cases = list(Recording.seen)
        pool.run(timed_step, target, cases[0], True, timeout_s=600)  # untimed: the recorder's first use
        plain = sum(pool.run(timed_step, target, c, False, timeout_s=600)[0] for c in cases)
        recorded = sum(pool.run(timed_step, target, c, True, timeout_s=600)[0] for c in cases)
    return cases, certify_s, plain, recorded


# ----------------------------------------------------------------------------- by hand, plain torch and torchtitan


def plain_case(case: Any) -> dict:
    """What the hand-written check needs of a drawn case, as plain numbers."""
    return {"seed": case.seed, "lengths": case.lengths, "m": case.microbatches, "mbs": case.micro_batch_size,
            "seq": case.seq_len, "max_norm": case.max_norm, "lr": case.lr, "cfg": case.config}


def hand_example(rank: int, mesh: Any, case: dict) -> bool:
    """One example by hand on this rank; on rank 0 whether every value is the reference's (``torch.allclose``,
    rtol 1e-9, atol 1e-12: what a hand-written check picks), True on the others."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torchtitan.distributed.utils import clip_grad_norm_

    from distcheck.libs.targets.torchtitan_llama import _model_config, parallelize
    from distcheck.parallel.step.reference import StepLayout

    def ce_sum(logits: Any, y: Any) -> Any:
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")

    def full(t: Any) -> Any:
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()

    torch.manual_seed(case["seed"])
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = _model_config(case["cfg"]).build()
        model.init_weights(buffer_device=None)
    finally:
        torch.set_default_dtype(dtype)
    reference = copy.deepcopy(model) if rank == 0 else None
    steps, m, seq, dp = len(case["lengths"]), case["m"], case["seq"], 2
    g = torch.Generator().manual_seed(case["seed"])
    shape = (steps, dp, m, case["mbs"], seq)
    tokens = torch.randint(0, case["cfg"].vocab_size, shape, generator=g)
    labels = torch.randint(0, case["cfg"].vocab_size, shape, generator=g)
    labels[torch.arange(seq) >= torch.tensor(case["lengths"])[..., None]] = -100
    model = parallelize(model, mesh, StepLayout(dp_shard=dp, tp=2))
    opt = torch.optim.AdamW(model.parameters(), lr=case["lr"], **ADAMW)
    d = mesh.get_local_rank("dp_shard")
    got = []
    for s in range(steps):
        opt.zero_grad()
        total = int((labels[s] != -100).sum())
        both = torch.zeros(2, dtype=torch.float64)
        for k in range(m):
            loss = ce_sum(model(tokens[s, d, k]), labels[s, d, k])
            (loss / total).backward()  # torchtitan's scaling: its FSDP2 sums over dp
            both += torch.stack([loss.detach(), (labels[s, d, k] != -100).sum().double()])
        dist.all_reduce(both, group=mesh.get_group("dp_shard"))
        norm = full(clip_grad_norm_(list(model.parameters()), case["max_norm"], foreach=True))
        opt.step()
        state = {n: [full(p)] + [full(opt.state[p][k]) for k in ("exp_avg", "exp_avg_sq")]
                 for n, p in model.named_parameters()}
        got.append((float(both[0] / both[1]), float(norm), int(both[1]), state))
    if reference is None:
        return True
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=case["lr"], **ADAMW)
    for s, (loss, norm, seen, state) in enumerate(got):
        ref_opt.zero_grad()
        y = labels[s].reshape(-1, seq)
        total = int((y != -100).sum())
        ref_loss = ce_sum(reference(tokens[s].reshape(-1, seq)), y) / total
        ref_loss.backward()
        ref_norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), case["max_norm"]))
        ref_opt.step()
        close = [abs(loss - float(ref_loss.detach())) <= 1e-9, abs(norm - ref_norm) <= 1e-9 * ref_norm, seen == total]
        for n, p in reference.named_parameters():
            want = [p.detach()] + [ref_opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")]
            close += [torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(state[n], want, strict=True)]
        if not all(close):
            return False
        # the next step starts from where the parallel run got, as the contract's reference does
        with torch.no_grad():
            for n, p in reference.named_parameters():
                p.copy_(state[n][0])
                ref_opt.state[p]["exp_avg"].copy_(state[n][1])
                ref_opt.state[p]["exp_avg_sq"].copy_(state[n][2])
    return True


def hand_rank(rank: int, port: int, cases: list, out: Any) -> None:
    """One process of the hand-written world: one untimed example, then the timed loop (rank 0 reports it)."""
    import logging
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (1, 1, 2, 1, 2), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
        hand_example(rank, mesh, cases[0])
        dist.barrier()
        t0 = time.perf_counter()
        flagged = sum(not hand_example(rank, mesh, case) for case in cases)
        dist.barrier()
        if rank == 0:
            out.put((time.perf_counter() - t0, flagged))
    finally:
        dist.destroy_process_group()


def run_by_hand(cases: list) -> tuple[float, int]:
    """The seconds of the hand-written loop over ``cases`` (plain numbers), timed inside the ranks, and how many
    of them its ``torch.allclose`` comparison flagged."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("fork").SimpleQueue()
    mp.start_processes(hand_rank, args=(port, cases, out), nprocs=WORLD, start_method="fork")
    seconds, flagged = out.get()
    return float(seconds), int(flagged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=3, help="examples on each side (default 3)")
    parser.add_argument("--model", choices=tuple(TARGETS), default="small",
                        help="small: the sizes distcheck libs runs (default); debugmodel: torchtitan's debug model's")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed.fsdp
    import torch.distributed.tensor.parallel
    import torchtitan

    cases, certify_s, plain_s, recorded_s = run_distcheck(TARGETS[args.model], args.examples)
    hand_s, flagged = run_by_hand([plain_case(c) for c in cases])
    n = len(cases)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"bench_real_step: torchtitan {torchtitan.__version__} Llama 3 ({args.model} sizes) under parallelize_llama, "
          f"{LAYOUT.replace(',', ' x ')} at world size {WORLD} ({os.cpu_count()} CPUs, load average {load}, "
          f"torch {torch.__version__})")
    print("| side | examples | seconds | examples/s | ratio |")
    print("|---|---|---|---|---|")
    print(f"| distcheck certify (warm gloo pool) | {n} | {certify_s:.2f} | {n / certify_s:.3f} | "
          f"{certify_s / hand_s:.2f}x the hand-written check |")
    print(f"| by hand (plain torch and torchtitan, one world) | {n} | {hand_s:.2f} | {n / hand_s:.3f} | 1.00x |")
    print(f"| plain step (run_step, record=False) | {n} | {plain_s:.2f} | {n / plain_s:.3f} | 1.00x |")
    print(f"| recorded replay (run_step, record=True) | {n} | {recorded_s:.2f} | {n / recorded_s:.3f} | "
          f"{recorded_s / plain_s:.2f}x the plain step |")
    if flagged:
        print(f"the hand-written check (torch.allclose, rtol=1e-9, atol=1e-12) flagged {flagged} of {n} examples that "
              "distcheck certified within its derived bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
