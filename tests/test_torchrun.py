"""TorchrunWorld and ``distcheck check --launcher torchrun``.

The rank-level contract (results and failures shared by every rank, the exit
code broadcast from rank 0) is tested cheaply inside a gloo RankPool, whose
children already hold a process group that TorchrunWorld joins; one real
``torchrun --standalone`` launch tests the command end to end.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from distcheck.core.errors import ConfigError, DistributedError, RankFailure


def _env(ctx, rank=None):
    r = ctx.rank if rank is None else rank
    return {"RANK": str(r), "WORLD_SIZE": str(ctx.world_size), "LOCAL_RANK": str(r)}


def _value_error_on_1(ctx):
    if ctx.rank == 1:
        raise ValueError("torchrun rank 1 is unhappy")
    return ctx.rank * 10


def _torchrun_world_contract(ctx):
    """Inside a pool rank: results, a labelled failure, and a mismatched RANK, all through TorchrunWorld."""
    from distcheck.runners.torchrun_world import TorchrunWorld

    world = TorchrunWorld(backend="gloo", timeout_s=30, environ=_env(ctx))
    ok = world.run(_square_rank)
    try:
        world.run(_value_error_on_1)
        failure = None
    except RankFailure as exc:
        failure = (exc.rank, "torchrun rank 1 is unhappy" in exc.traceback_text, sorted(exc.failures))
    world.close()  # must not destroy the pool's process group (it did not create it)
    wrong = TorchrunWorld(backend="gloo", environ=_env(ctx, rank=(ctx.rank + 1) % ctx.world_size))
    try:
        wrong.start()
        mismatch = None
    except ConfigError as exc:
        mismatch = exc.field
    return ok, failure, mismatch


def _square_rank(ctx):
    return ctx.rank**2


def _check_under_torchrun(ctx, golden_dir):
    from distcheck.runners.torchrun import run_check_under_torchrun

    args = SimpleNamespace(backend="gloo", timeout=60.0, format="json", only=["golden"], skip=[],
                           world_sizes=(7,), golden_dir=golden_dir, profile=None)
    return run_check_under_torchrun(args, environ=_env(ctx))


# ----------------------------------------------------------------------------- no processes


@pytest.mark.parametrize(
    "env, field",
    [
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"}, "LOCAL_RANK"),
    ],
)
def test_torchrun_world_validates_the_environment(env, field):
    from distcheck.runners.torchrun_world import TorchrunWorld

    with pytest.raises(ConfigError) as info:
        TorchrunWorld(environ=env)
    assert info.value.field == field


def test_launched_by_torchrun_needs_all_three_variables():
    from distcheck.runners.torchrun_world import launched_by_torchrun

    assert launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert not launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "1"})


def test_torchrun_world_rejects_bad_backend_and_timeout():
    from distcheck.runners.torchrun import run_check_under_torchrun
    from distcheck.runners.torchrun_world import TorchrunWorld

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    with pytest.raises(ConfigError) as info:
        TorchrunWorld(backend="threaded", environ=env)
    assert info.value.field == "backend"
    with pytest.raises(ConfigError) as info:
        TorchrunWorld(timeout_s=0, environ=env)
    assert info.value.field == "timeout_s"
    args = SimpleNamespace(backend="threaded", timeout=10.0, format="json", only=None, skip=[])
    with pytest.raises(ConfigError, match="backend='threaded' cannot run under torchrun"):
        run_check_under_torchrun(args, environ=env)


# ----------------------------------------------------------------------------- inside a gloo pool


@pytest.mark.multiprocess
def test_torchrun_world_shares_results_and_failures_on_every_rank():
    from distcheck.runners import RankPool

    with RankPool(2, timeout_s=60) as pool:
        res = pool.run(_torchrun_world_contract)
        # the pool's own group survived TorchrunWorld.close(): it still runs collectives
        assert pool.run(_square_rank) == [0, 1]
    for ok, failure, mismatch in res:
        assert ok == [0, 1]  # every rank gets every rank's result, in rank order
        assert failure == (1, True, [1])  # every rank raises rank 1's labelled traceback
        assert mismatch == "RANK"


@pytest.mark.multiprocess
def test_exit_code_is_rank_0s_on_every_rank(tmp_path):
    """Rank 0 alone runs the pure stages; a failure there must reach every rank's exit code."""
    from distcheck.runners import RankPool

    with RankPool(2, timeout_s=60) as pool:
        good = pool.run(_check_under_torchrun, None)
        bad = pool.run(_check_under_torchrun, str(tmp_path / "no-such-golden-folder"))
    assert good == [0, 0]
    assert bad == [1, 1]  # rank 1 ran no golden check; it still exits 1


def test_broken_exchange_is_reported_as_distributed_error():
    from distcheck.runners.torchrun_world import TorchrunWorld

    world = TorchrunWorld(backend="gloo", environ={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    world._broken = "result exchange failed after f: timed out"
    world._ctx = object()  # pretend started
    with pytest.raises(DistributedError, match="is broken: result exchange failed"):
        world.run(_square_rank)


# ----------------------------------------------------------------------------- a real torchrun launch


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_distcheck_check_under_torchrun_two_ranks(torchrun_check):
    """``torchrun --standalone --nproc-per-node=2 -m distcheck check --launcher torchrun`` (torch stages)."""
    out, _ = torchrun_check(2, "--skip", "properties", "--skip", "golden", "--format", "json", "--timeout", "90")
    rows = json.loads(out)  # rank 0 alone prints: stdout is exactly one JSON report
    verdicts = {(r["check"], r["backend"], r["world_size"]): r["verdict"] for r in rows}
    for name in ("ddp.equal_shards.grads", "ddp.unequal_shards.plain.full_batch", "ddp.unequal_shards.hook.grads",
                 "comm.bytes_per_rank.all_gather", "zero1.bytes_per_rank", "fsdp2[reshard=True].bytes_per_rank",
                 "tp.mlp.collectives.forward[float64]", "pp.grads.ScheduleGPipe", "mesh.groups"):
        assert verdicts[(name, "gloo", 2)] == "pass", name
    assert verdicts[("mesh.groups.fake", "fake", 16_384)] == "pass"  # world-free, run by rank 0 before joining
    assert not [r for r in rows if r["verdict"] == "FAIL"]
    assert {r["verdict"] for r in rows if r["check"] == "pp.executed_order.Schedule1F1B"} == {"finding"}
    # a torchrun world opens no pools beside it: the checkpoint rows load on it alone, and say so
    ckpt = [r for r in rows if r["check"].startswith("checkpoint.dcp.round_trip")]
    assert ckpt and all(r["verdict"] == "pass" and "run with reshard=False" in r["detail"]
                        and "worlds of 4 ranks" in r["detail"] for r in ckpt), ckpt
