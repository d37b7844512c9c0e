"""Examples per second of the ``training-step`` contract, against the same step written by hand. Prints one table.

    python benchmarks/bench_step.py                 # 6 examples each side, world size 4
    python benchmarks/bench_step.py --examples 12

Both sides run in this one run, on world size 4 with the composition dp_shard = 2 x tp = 2 (FSDP2's
``fully_shard`` over dp_shard, torchtitan's Llama plan with ``parallelize_module`` over tp; the
``parallelize`` function of ``examples/my_step.py``):

* **distcheck certify**: ``certify(examples.my_step:parallelize, "training-step", options={"layout":
  "dp_shard=2,tp=2"})`` on a warm gloo pool of 4 ranks (one example first, untimed, to load what the
  ranks import). Each example: Hypothesis draws the decoder's sizes, the micro-batches, the padded
  lengths, the clip threshold, the learning rate and 2 or 3 steps; every rank builds the decoder,
  parallelizes it, runs the steps and gathers every parameter and AdamW moment; rank 0 runs the float64
  reference (each step from the state the ranks reached); the parent checks every rank's values against it.
* **distcheck certify, bfloat16**: the same, ``dtypes=["bfloat16"]``, ``mixed_precision="fsdp"`` (FSDP2's
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, fp32 master weights): rank 0 also runs the
  single-device bf16 step beside the float64 shadow (``distcheck/parallel/step/precision.py``).
* **by hand**: the same examples (the cases the certify side drew, as plain numbers) in plain torch
  with no distcheck: four processes started once with ``torch.multiprocessing`` (``fork``) and
  ``init_process_group("gloo")``, the decoder written out below, the same ``parallelize``, the same
  AdamW, data, loss (token sum x dp / global tokens), ``clip_grad_norm_`` and steps, every parameter and
  AdamW moment gathered with ``full_tensor()``; rank 0 runs the single-device float64 step and compares
  its own gathered values (``torch.allclose``) and the reported loss and norm. The loop is timed
  inside the ranks (the processes' start is not counted, as the warm pool's is not).

The ratio is each side's rate over the hand-written (float64) rate; the line under the table gives the bf16
certification's rate over the float64 one's. A script, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from types import SimpleNamespace
from typing import Any, ClassVar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distcheck.parallel.step.contracts import TrainingStep  # noqa: E402

TARGET = "examples.my_step:parallelize"
LAYOUT = "dp_shard=2,tp=2"
WORLD = 4
ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


class Recording(TrainingStep):
    """The training-step contract, keeping (in the parent) every case it checks."""

    seen: ClassVar[list] = []

    def check(self, case: Any, results: list, world_size: int, dtype: str, options: dict) -> dict:
        Recording.seen.append(case)
        return super().check(case, results, world_size, dtype, options)


def run_certify(examples: int, dtype: str = "float64") -> tuple[list, float]:
    """The certify side in ``dtype`` (bfloat16: FSDP2's mixed-precision policy): the cases drawn and the seconds of
    the timed run."""
    from distcheck.certify import certify
    from distcheck.parallel.step.checks import PRELOAD
    from distcheck.runners import RankPool

    options = {"layout": LAYOUT, **({"mixed_precision": "fsdp"} if dtype == "bfloat16" else {})}
    with RankPool(WORLD, backend="gloo", timeout_s=600, preload=PRELOAD) as pool:
        certify(TARGET, Recording(), pool=pool, examples=1, seed=1, dtypes=[dtype],
                options=options).assert_certified()
        Recording.seen.clear()
        t0 = time.perf_counter()
        cert = certify(TARGET, Recording(), pool=pool, examples=examples, seed=0, dtypes=[dtype], options=options)
        seconds = time.perf_counter() - t0
    cert.assert_certified()
    return list(Recording.seen), seconds


# ----------------------------------------------------------------------------- by hand, plain torch


def tiny_llama(cfg: dict) -> Any:
    """distcheck's tiny decoder written out: embedding, pre-norm blocks of GQA attention and a SwiGLU MLP,
    RMSNorm, a tied or untied head (torchtitan's module names, so the same plan applies)."""
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            hd, q, kv = cfg["head_dim"], cfg["n_heads"], cfg["n_kv_heads"]
            self.rep = q // kv
            self.wq, self.wk = nn.Linear(cfg["dim"], q * hd, bias=False), nn.Linear(cfg["dim"], kv * hd, bias=False)
            self.wv, self.wo = nn.Linear(cfg["dim"], kv * hd, bias=False), nn.Linear(q * hd, cfg["dim"], bias=False)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            hd = cfg["head_dim"]
            q = self.wq(x).view(b, s, -1, hd).transpose(1, 2)
            k = self.wk(x).view(b, s, -1, hd).repeat_interleave(self.rep, dim=2).transpose(1, 2)
            v = self.wv(x).view(b, s, -1, hd).repeat_interleave(self.rep, dim=2).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(cfg["dim"], cfg["ffn_dim"], bias=False)
            self.w2 = nn.Linear(cfg["ffn_dim"], cfg["dim"], bias=False)
            self.w3 = nn.Linear(cfg["dim"], cfg["ffn_dim"], bias=False)

        def forward(self, x: Any) -> Any:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(cfg["dim"], eps=1e-6), nn.RMSNorm(cfg["dim"], eps=1e-6)
            self.attention, self.feed_forward = Attention(), FeedForward()

        def forward(self, x: Any) -> Any:
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(**cfg)
            self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
            self.layers = nn.ModuleDict({str(i): Block() for i in range(cfg["n_layers"])})
            self.norm = nn.RMSNorm(cfg["dim"], eps=1e-6)
            self.output = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)
            if cfg["tied"]:
                self.output.weight = self.tok_embeddings.weight

        def forward(self, tokens: Any) -> Any:
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h)
            return self.output(self.norm(h))

    return Model().double()


def plain_case(case: Any) -> dict:
    """A drawn case as plain numbers (what the hand-written step takes)."""
    c = case.config
    return {"cfg": {k: getattr(c, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                                                "vocab_size", "tied")},
            "m": case.microbatches, "mbs": case.micro_batch_size, "seq": case.seq_len, "lengths": case.lengths,
            "max_norm": case.max_norm, "lr": case.lr, "seed": case.seed}


def hand_example(rank: int, mesh: Any, case: dict) -> None:
    """One example by hand on this rank; rank 0 raises AssertionError when a value is not the reference's."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from distcheck.parallel.step.reference import StepLayout
    from examples.my_step import parallelize

    def ce_sum(logits: Any, y: Any) -> Any:
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")

    def full(t: Any) -> Any:
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()

    torch.manual_seed(case["seed"])
    model = tiny_llama(case["cfg"])
    reference = copy.deepcopy(model) if rank == 0 else None
    steps, m, seq, dp = len(case["lengths"]), case["m"], case["seq"], 2
    g = torch.Generator().manual_seed(case["seed"])
    shape = (steps, dp, m, case["mbs"], seq)
    tokens = torch.randint(0, case["cfg"]["vocab_size"], shape, generator=g)
    labels = torch.randint(0, case["cfg"]["vocab_size"], shape, generator=g)
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
            (loss * dp / total).backward()
            both += torch.stack([loss.detach(), (labels[s, d, k] != -100).sum().double()])
        dist.all_reduce(both, group=mesh.get_group("dp_shard"))
        norm = full(torch.nn.utils.clip_grad_norm_(model.parameters(), case["max_norm"]))
        opt.step()
        state = {n: [full(p)] + [full(opt.state[p][k]) for k in ("exp_avg", "exp_avg_sq")]
                 for n, p in model.named_parameters()}
        got.append((float(both[0] / both[1]), float(norm), int(both[1]), state))
    if reference is None:
        return
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
            raise AssertionError(f"step {s + 1} of {case} differs from the reference")


def hand_rank(rank: int, port: int, cases: list, out: Any) -> None:
    """One process of the hand-written world: one untimed example, then the timed loop (rank 0 reports it)."""
    import logging
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    # the same quiet as the contract's ranks: DTensor's flattening hints, FSDP2's view-output warning
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        # torchtitan's mesh with its flattened dims, as the contract's ranks build it (harness.mesh_for)
        mesh = init_device_mesh("cpu", (1, 1, 2, 1, 2), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
        hand_example(rank, mesh, cases[0])
        dist.barrier()
        t0 = time.perf_counter()
        for case in cases:
            hand_example(rank, mesh, case)
        dist.barrier()
        if rank == 0:
            out.put(time.perf_counter() - t0)
    finally:
        dist.destroy_process_group()


def run_by_hand(cases: list) -> float:
    """The seconds of the hand-written loop over ``cases`` (plain numbers), timed inside the ranks."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("fork").SimpleQueue()
    mp.start_processes(hand_rank, args=(port, cases, out), nprocs=WORLD, start_method="fork")
    return float(out.get())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=6, help="examples on each side (default 6)")
    args = parser.parse_args(argv)

    import torch  # loaded once, before any timing
    import torch.distributed.fsdp
    import torch.distributed.tensor.parallel

    drawn, certify_s = run_certify(args.examples)
    bf16, bf16_s = run_certify(args.examples, "bfloat16")
    hand_s = run_by_hand([plain_case(c) for c in drawn])
    n = len(drawn)
    rate, hand_rate, bf16_rate = n / certify_s, n / hand_s, len(bf16) / bf16_s
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"bench_step: training-step, {LAYOUT.replace(',', ' x ')} at world size {WORLD}, examples per second "
          f"({os.cpu_count()} CPUs, load average {load}, torch {torch.__version__})")
    print("| side | examples | seconds | examples/s | ratio to by hand |")
    print("|---|---|---|---|---|")
    print(f"| distcheck certify (warm gloo pool) | {n} | {certify_s:.2f} | {rate:.3f} | {rate / hand_rate:.2f}x |")
    print(f"| distcheck certify, bfloat16 (FSDP2 MixedPrecisionPolicy) | {len(bf16)} | {bf16_s:.2f} | "
          f"{bf16_rate:.3f} | {bf16_rate / hand_rate:.2f}x |")
    print(f"| by hand (plain torch, one world) | {n} | {hand_s:.2f} | {hand_rate:.3f} | 1.00x |")
    print(f"bfloat16 over float64 certification: {bf16_rate / rate:.2f}x the examples per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
