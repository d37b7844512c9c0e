"""The DDP and layer checks on NCCL, one rank per visible GPU; skipped without CUDA.

Skips are decided in the parent before anything is spawned (tests/conftest.py).
World size = ``torch.cuda.device_count()``: with one GPU that is 1, where the
checks still run every rank function on ``cuda:0`` through NCCL (the
unequal-shard DDP rows need two ranks and are ``skip``). Run on a GPU node:

    PYTHONPATH=. python -m pytest tests/test_gpu.py -m gpu -q
"""

from __future__ import annotations

import json

import pytest

from distcheck.report import FAIL, FINDING, PASS, SKIP

pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess,
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _where_am_i(ctx):
    """Rank function: the rank's device, CUDA's current device, and an NCCL all-reduce done on it."""
    import torch
    import torch.distributed as dist

    t = torch.full((4,), float(ctx.rank + 1), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return str(ctx.device), torch.cuda.current_device(), str(t.device), t.tolist(), dist.get_backend()


def test_nccl_pool_puts_rank_r_on_cuda_r():
    from distcheck.runners import RankPool

    n = _gpus()
    with RankPool(n, backend="nccl", timeout_s=180) as pool:
        res = pool.run(_where_am_i)
    total = float(n * (n + 1) // 2)
    assert res == [(f"cuda:{r}", r, f"cuda:{r}", [total] * 4, "nccl") for r in range(n)]


def test_ddp_rows_on_nccl():
    from distcheck import stages

    n = _gpus()
    rows = {r.check: r for r in stages.run_stages([stages.stage("distributed")], stages.CheckOptions(
        backend="nccl", world_sizes=(n,), timeout_s=180))}
    assert {r.backend for r in rows.values()} == {"nccl"}
    assert not [r for r in rows.values() if r.verdict == FAIL], [r.detail for r in rows.values()]
    assert rows["ddp.equal_shards.grads"].verdict == PASS and rows["ddp.equal_shards.grads"].examples == 10
    unequal = {r.verdict for name, r in rows.items() if name.startswith("ddp.unequal_shards.")}
    assert unequal == ({SKIP} if n == 1 else {PASS})


def test_layer_rows_on_nccl():
    from distcheck import stages

    n = _gpus()
    rows = stages.run_stages([stages.stage("layers")], stages.CheckOptions(backend="nccl", world_sizes=(n,),
                                                                          timeout_s=180))
    fails = [(r.check, r.detail) for r in rows if r.verdict == FAIL]
    assert not fails, fails
    nccl = {r.check: r.verdict for r in rows if r.backend == "nccl"}
    for check in ("comm.bytes_per_rank.all_reduce", "comm.bytes_per_rank.all_gather",
                  "comm.bytes_per_rank.reduce_scatter", "zero1.params", "zero1.bytes_per_rank",
                  "fsdp2[reshard=True].params", "fsdp2[reshard=False].params", "fsdp2[reshard=True].bytes_per_rank",
                  "pp.grads.ScheduleGPipe", "pp.grads.ScheduleInterleaved1F1B", "pp.grads.ScheduleZBVZeroBubble",
                  "mesh.groups"):
        assert nccl.get(check) == PASS, (check, nccl.get(check))
    tp = ("tp.mlp.forward[float64]", "tp.mlp.param_grads[bfloat16]", "tp.mlp.collectives.forward[float32]",
          "tp.attention.forward[float64]", "tp.attention.param_grads[float64]",
          "tp.attention.collectives.backward[bfloat16]")
    if n == 1:  # tensor parallelism can fail from 2 ranks (the contracts' min_world_size): skip rows below
        assert {nccl.get(check) for check in tp} == {SKIP}
    else:
        assert {check: nccl.get(check) for check in tp} == dict.fromkeys(tp, PASS)
    assert set(nccl.values()) <= {PASS, FINDING, SKIP}


def test_distcheck_check_under_torchrun_on_nccl(torchrun_check):
    n = _gpus()
    out, _ = torchrun_check(n, "--backend", "nccl", "--skip", "properties", "--skip", "golden", "--format", "json",
                            "--timeout", "180", timeout_s=400)
    rows = json.loads(out)
    assert not [r for r in rows if r["verdict"] == FAIL]
    got = {(r["check"], r["backend"], r["world_size"]): r["verdict"] for r in rows}
    assert got[("ddp.equal_shards.grads", "nccl", n)] == PASS
    assert got[("tp.mlp.forward[float64]", "nccl", n)] == (PASS if n > 1 else "skip")
