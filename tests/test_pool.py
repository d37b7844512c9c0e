"""RankPool: start, run, reuse, failures (raise, hang, death), recovery, cleanup; threaded and fake backends."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from distcheck.core.errors import BackendUnavailable, ConfigError, DistributedError, RankFailure, WorldTimeout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- rank functions (module level: picklable)


def _allreduce_rank_plus(ctx, x):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + x)], device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return t.item(), ctx.rank, ctx.world_size, ctx.backend, os.getpid()


def _echo(ctx, a, b):
    return (ctx.rank, a, b)


def _count_calls(ctx):
    ctx.scratch["calls"] = ctx.scratch.get("calls", 0) + 1
    return ctx.scratch["calls"]


def _raise_on_1(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError(f"bad value on rank {ctx.rank}")
    dist.barrier()
    return ctx.rank


def _raise_everywhere(ctx):
    raise KeyError(f"missing on {ctx.rank}")


def _hang_on_1(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        _sleep_forever()
    dist.barrier()


def _sleep_forever():
    while True:
        time.sleep(0.05)


def _exit_on_1(ctx):
    import torch.distributed as dist

    if ctx.rank == 1:
        os._exit(7)
    dist.barrier()


def _segfault_on_0(ctx):
    if ctx.rank == 0:
        ctypes.string_at(0)
    return ctx.rank


def _shape_by_rank(ctx):
    import torch

    from distcheck.engine.world import check_same_shape

    check_same_shape(ctx, torch.zeros(2 + ctx.rank), "payload")


def _draws(ctx):
    import torch

    from distcheck.runners.threaded import rank_generator

    return torch.randint(0, 2**30, (4,), generator=rank_generator(ctx, 5)).tolist()


def _mesh_layout(ctx):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (128, 128), mesh_dim_names=("dp", "tp"))
    return tuple(mesh.get_coordinate()), mesh["tp"].size(), mesh["dp"].size()


def _hang_rank_1_at_init(*args, rank=None, **kwargs):
    """Stands in for ``dist.init_process_group`` in forked children: rank 1 never comes up."""
    if rank == 1:
        _sleep_forever()
    return _REAL_INIT(*args, rank=rank, **kwargs)


def _hang_every_rank_at_init(*args, **kwargs):
    _sleep_forever()


_REAL_INIT = None

#: a grandchild that ignores SIGTERM (and SIGINT, SIGHUP): only SIGKILL ends it
_STUBBORN = ("import signal, sys, time\n"
             "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\n"
             "print('ready', flush=True)\n"
             "time.sleep(1000)\n")


def _start_stubborn(**popen_kwargs) -> int:
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE, text=True, **popen_kwargs)
    assert proc.stdout.readline().strip() == "ready"  # its signal dispositions are in place
    _KEEP.append(proc)
    return proc.pid


_KEEP: list = []  # Popen objects of a rank's grandchildren (a rank never waits for them)


def _spawn_descendants(ctx, escaped=False):
    """Start descendants that outlive this rank function; return their pids.

    In the rank's process group: a stubborn child, and an orphan (its shell
    exits at once, as with ``cmd &``). With ``escaped``, also a child in a session
    of its own and a daemon (a new session whose parent exited at once).
    """
    pids = {"child": _start_stubborn()}
    out = subprocess.run(["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True)
    pids["orphan"] = int(out.stdout)
    if escaped:
        pids["session"] = _start_stubborn(start_new_session=True)
        out = subprocess.run(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"], capture_output=True,
                             text=True, check=True)
        pids["daemon"] = int(out.stdout)
    return pids


def _spawn_then_die_on_1(ctx):
    import torch.distributed as dist

    pids = _spawn_descendants(ctx)
    if ctx.rank == 1:
        sys.stdout.write(f"DESCENDANTS {pids['child']} {pids['orphan']}\n")
        sys.stdout.flush()
        ctx.scratch["pids"] = pids
        os._exit(3)
    dist.barrier()
    return pids


def _spawn_then_hang_on_1(ctx):
    import torch.distributed as dist

    pids = _spawn_descendants(ctx)
    ctx.scratch["pids"] = pids
    with open(os.path.join(os.environ["DESCENDANTS_DIR"], f"rank{ctx.rank}"), "w") as f:
        f.write(f"{pids['child']} {pids['orphan']}")
    if ctx.rank == 1:
        _sleep_forever()
    dist.barrier()


def _wait_gone(pids, seconds: float = 10.0) -> list[int]:
    """Poll until every pid is gone (or a zombie); return the ones still alive at the deadline."""
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _kill_leftovers(pids) -> None:
    """Test hygiene: SIGKILL the given pids (processes this test started) that are still alive."""
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def _group_members(pgid: int) -> list[int]:
    """Every live process of process group ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[2] == str(pgid) and fields[0] != "Z":
                members.append(int(name))
    return members


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- no torch at import


def test_import_does_not_load_torch():
    code = ("import sys, distcheck.runners, distcheck.runners.pool, distcheck.parallel.dp.checks, "
            "distcheck.parallel.dp.contracts, distcheck.parallel.zero.contracts, distcheck.parallel.tp.checks; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2.0}, "world_size"),
        ({"world_size": 2, "backend": "mpi"}, "backend"),
        ({"world_size": 2, "timeout_s": 0}, "timeout_s"),
        ({"world_size": 2, "timeout_s": float("nan")}, "timeout_s"),
        ({"world_size": 2, "start_method": "forkserver"}, "start_method"),
        ({"world_size": 1, "backend": "nccl", "start_method": "fork"}, "start_method"),
    ],
)
def test_bad_arguments_raise_config_error(kwargs, field):
    from distcheck.runners import RankPool

    with pytest.raises(ConfigError) as info:
        RankPool(**kwargs)
    assert info.value.field == field


def test_nccl_without_gpus_is_unavailable_before_anything_starts():
    import torch

    from distcheck.runners import RankPool

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("GPUs present: NCCL is available")
    before = mp.active_children()
    with pytest.raises(BackendUnavailable, match="(?i)nccl"):
        RankPool(2, backend="nccl")
    assert mp.active_children() == before


# ----------------------------------------------------------------------------- gloo worlds


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_start_run_reuse(world_size):
    from distcheck.runners import RankPool

    with RankPool(world_size, timeout_s=30) as pool:
        first = pool.run(_allreduce_rank_plus, 3)
        pids = pool.pids
        second = pool.run(_allreduce_rank_plus, 10)
        calls = [pool.run(_count_calls) for _ in range(3)]
        assert pool.pids == pids and pool.generation == 1  # the same world served every run
    expected = sum(range(world_size)) + 3 * world_size
    assert [r[0] for r in first] == [float(expected)] * world_size
    assert [r[1:4] for r in first] == [(r, world_size, "gloo") for r in range(world_size)]
    assert [r[0] for r in second] == [float(expected + 7 * world_size)] * world_size
    assert sorted({r[4] for r in first}) == sorted(pids)
    assert calls == [[1] * world_size, [2] * world_size, [3] * world_size]


@pytest.mark.multiprocess
def test_run_on_gives_each_rank_its_arguments():
    from distcheck.runners import RankPool

    with RankPool(3, timeout_s=30) as pool:
        assert pool.run_on(_echo, [(0, "a"), (1, "b"), (2, "c")]) == [(0, 0, "a"), (1, 1, "b"), (2, 2, "c")]
        with pytest.raises(ConfigError):
            pool.run_on(_echo, [(0, "a")])
        with pytest.raises(ConfigError, match="picklable"):
            pool.run(lambda ctx: 1)


@pytest.mark.multiprocess
def test_raising_rank_is_reported_with_rank_and_traceback_then_pool_recovers():
    from distcheck.runners import RankPool

    with RankPool(4, timeout_s=30) as pool:
        t0 = time.monotonic()
        with pytest.raises(RankFailure) as info:
            pool.run(_raise_on_1)
        assert time.monotonic() - t0 < 5  # reported at once, not at the timeout
        err = info.value
        assert err.rank == 1
        assert "ValueError: bad value on rank 1" in err.traceback_text
        assert "_raise_on_1" in err.traceback_text
        assert isinstance(err.__cause__, ValueError)
        assert not pool.running  # others were stuck in the barrier: world torn down
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [6.0] * 4
        assert pool.generation == 2

        with pytest.raises(RankFailure) as info:
            pool.run(_raise_everywhere)
        assert info.value.rank == 0 and sorted(info.value.failures) == [0, 1, 2, 3]
        assert str(info.value).startswith("rank 0 failed:\nTraceback (most recent call last):")
        assert all(f"KeyError: 'missing on {r}'" in info.value.failures[r] for r in range(4))
        copy = pickle.loads(pickle.dumps(info.value))  # e.g. sent on by a pytest-xdist worker
        assert (copy.rank, copy.failures, str(copy)) == (0, info.value.failures, str(info.value))
        assert pool.running and pool.generation == 2  # every rank answered: world kept
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 1)] == [10.0] * 4


def _refuse(*args, **kwargs):
    raise RuntimeError("refused during set-up")


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["gloo", "threaded"])
def test_a_child_that_fails_to_set_up_is_reported_with_its_ranks_traceback(backend, monkeypatch):
    """Children are forked, so a patched faulthandler.register in this process is theirs too."""
    import faulthandler

    from distcheck.runners import RankPool

    monkeypatch.setattr(faulthandler, "register", _refuse)
    pool = RankPool(2, backend=backend, timeout_s=30)
    try:
        with pytest.raises(RankFailure) as info:
            pool.start()
        assert not pool.running
    finally:
        pool.close()
    err = info.value
    assert err.rank == 0 and sorted(err.failures) == [0, 1]
    assert str(err).startswith("rank 0 failed:\nTraceback (most recent call last):")
    assert all("RuntimeError: refused during set-up" in err.failures[r] for r in (0, 1))


@pytest.mark.multiprocess
def test_hanging_rank_times_out_with_stacks_then_pool_recovers():
    from distcheck.runners import RankPool

    with RankPool(2, timeout_s=30) as pool:
        pool.run(_allreduce_rank_plus, 0)
        t0 = time.monotonic()
        with pytest.raises(WorldTimeout) as info:
            pool.run(_hang_on_1, timeout_s=1.5)
        elapsed = time.monotonic() - t0
        assert 1.5 <= elapsed < 1.5 + 4
        err = info.value
        assert err.ranks == [0, 1] and err.timeout_s == 1.5
        assert "_sleep_forever" in err.stacks[1] and "_hang_on_1" in err.stacks[1]
        assert "barrier" in err.stacks[0]
        assert "rank 1" in str(err)
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [1.0, 1.0]


@pytest.mark.multiprocess
def test_dying_rank_is_reported_then_pool_recovers():
    from distcheck.runners import RankPool

    with RankPool(3, timeout_s=30) as pool:
        pids = pool.pids
        with pytest.raises(RankFailure) as info:
            pool.run(_exit_on_1)
        assert info.value.rank == 1 and "exited with code 7" in info.value.traceback_text
        assert not any(_alive(p) for p in pids)
        with pytest.raises(RankFailure) as info:
            pool.run(_segfault_on_0)
        assert info.value.rank == 0 and "SIGSEGV" in info.value.traceback_text
        assert "_segfault_on_0" in info.value.traceback_text  # faulthandler's dump
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [3.0] * 3


@pytest.mark.multiprocess
def test_mismatched_shapes_are_caught():
    from distcheck.runners import RankPool

    with RankPool(2, timeout_s=30) as pool, pytest.raises(RankFailure, match="payload differs between ranks"):
        pool.run(_shape_by_rank)


@pytest.mark.multiprocess
def test_no_child_survives_close():
    from distcheck.runners import RankPool

    pool = RankPool(4, timeout_s=30)
    pool.run(_allreduce_rank_plus, 0)
    pids = pool.pids
    assert all(_alive(p) for p in pids)
    pool.close()
    assert not any(_alive(p) for p in pids)
    assert not [c for c in mp.active_children() if c.pid in pids]
    with pytest.raises(DistributedError, match="closed"):
        pool.run(_allreduce_rank_plus, 0)


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from distcheck.runners import RankPool
    import test_pool
    pool = RankPool(2, timeout_s=300).start()
    print(" ".join(map(str, pool.pids)), flush=True)
    if sys.argv[1] == "kill":
        time.sleep(60)
    else:
        pool.run(test_pool._hang_on_1)
    """
)



def _sigint_as_default() -> None:
    """In the child before exec: SIGINT at its default disposition and unblocked, whatever the test process
    (a pytest-xdist worker, say) holds, so that Python installs its KeyboardInterrupt handler there."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["kill", "interrupt"])
def test_children_die_with_a_killed_or_interrupted_parent(how, tmp_path):
    script = _ORPHAN_SCRIPT.format(tests=os.path.join(ROOT, "tests"))
    env = dict(os.environ, TMPDIR=str(tmp_path))  # a private temporary root: its pool folders are checked below
    proc = subprocess.Popen([sys.executable, "-c", script, how], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_sigint_as_default)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        time.sleep(0.3)  # let the interrupt case enter run()
        proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGINT)
        proc.wait(timeout=60)  # a cap for a loaded machine (the suite runs on 2 workers): not a timing claim
        assert _wait_gone(pids, 5) == []
        deadline = time.monotonic() + 5  # SIGKILL: the ranks' guards remove the folder; Ctrl-C: the pool's clean-up
        while any(p.name.startswith("distcheck-pool-") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("distcheck-pool-")]
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- every descendant dies with the pool

_DESCENDANTS_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from distcheck.runners import RankPool
    import test_pool
    pool = RankPool(2, timeout_s=60).start()
    pids = pool.run(test_pool._spawn_descendants)
    print(json.dumps({{"ranks": pool.pids, "descendants": [p for d in pids for p in d.values()],
                      "folder": pool._world.tmpdir}}), flush=True)
    time.sleep(120)
    """
)


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the descendant guarantee is Linux's (prctl)")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_every_descendant_and_the_folder_go_with_a_killed_parent(how, tmp_path):
    """A grandchild that ignores SIGTERM, and an orphaned one, die with the pool even when its parent is SIGKILLed.

    SIGKILL and SIGTERM (its default action) run no Python clean-up in the parent; SIGINT does
    (KeyboardInterrupt). In every case the ranks, their descendants and the pool's folder go.
    """
    import json

    script = _DESCENDANTS_SCRIPT.format(tests=os.path.join(ROOT, "tests"))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_sigint_as_default)
    pids: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        pids = info["ranks"] + info["descendants"]
        assert len(info["descendants"]) == 4 and all(_alive(p) for p in pids)
        assert os.path.isdir(info["folder"])
        proc.send_signal(getattr(signal, how))
        proc.wait(timeout=60)  # a cap for a loaded machine: not a timing claim
        assert _wait_gone(pids) == []
        deadline = time.monotonic() + 10
        while os.path.exists(info["folder"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(info["folder"])
    finally:
        proc.kill()
        proc.wait()
        _kill_leftovers(pids)


_EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from distcheck.runners import RankPool
    import test_pool
    pool = RankPool(2, timeout_s=60).start()
    pids = pool.run(test_pool._spawn_descendants)
    print(json.dumps({{"ranks": pool.pids, "descendants": [p for d in pids for p in d.values()],
                      "folder": pool._world.tmpdir}}), flush=True)
    if sys.argv[1] == "raise":
        raise RuntimeError("the script failed with its pool open")
    """
)


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the descendant guarantee is Linux's (prctl)")
@pytest.mark.parametrize("how", ["exit", "raise"])
def test_interpreter_exit_without_close_cleans_up(how, tmp_path):
    """A script that ends (or fails) with its pool open: the interpreter-exit clean-up takes everything."""
    import json

    script = _EXIT_SCRIPT.format(tests=os.path.join(ROOT, "tests"))
    proc = subprocess.run([sys.executable, "-c", script, how], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TMPDIR=str(tmp_path)))
    info = json.loads(proc.stdout.splitlines()[0])
    pids = info["ranks"] + info["descendants"]
    try:
        assert proc.returncode == (1 if how == "raise" else 0), proc.stderr
        assert _wait_gone(pids, 5) == []
        assert not os.path.exists(info["folder"])
    finally:
        _kill_leftovers(pids)


@pytest.mark.multiprocess
def test_garbage_collected_pool_cleans_up():
    import gc

    from distcheck.runners import RankPool

    pool = RankPool(2, timeout_s=60).start()
    pids, folder = pool.pids, pool._world.tmpdir
    assert all(_alive(p) for p in pids) and os.path.isdir(folder)
    del pool
    gc.collect()
    assert _wait_gone(pids, 0) == [] and not os.path.exists(folder)


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the descendant guarantee is Linux's (prctl)")
def test_close_kills_every_descendant_even_those_in_a_session_of_their_own():
    from distcheck.runners import RankPool

    pids: list[int] = []
    try:
        pool = RankPool(2, timeout_s=60).start()
        ranks = pool.pids
        found = pool.run(_spawn_descendants, True)
        pids = [p for d in found for p in d.values()]
        assert len(pids) == 8 and all(_alive(p) for p in pids)
        pool.close()
        assert _wait_gone(ranks, 0) == []  # reaped by close()
        # close() killed the ranks' groups; each rank, before it exited, killed the ones that left its group
        assert _wait_gone([p for r in ranks for p in _group_members(r)], 5) == []
        assert _wait_gone(pids) == []
    finally:
        _kill_leftovers(pids)


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the descendant guarantee is Linux's (prctl)")
def test_descendants_of_a_dead_or_stuck_rank_die_with_it(tmp_path, monkeypatch, capfd):
    from distcheck.runners import RankPool

    monkeypatch.setenv("DESCENDANTS_DIR", str(tmp_path))
    pids: list[int] = []
    try:
        with RankPool(2, timeout_s=60) as pool:
            with pytest.raises(RankFailure) as info:
                pool.run(_spawn_then_die_on_1)
            assert info.value.rank == 1 and "exited with code 3" in str(info.value)
            pids = [int(p) for p in capfd.readouterr().out.split("DESCENDANTS")[1].split()[:2]]
            assert _wait_gone(pids) == []

            with pytest.raises(WorldTimeout):
                pool.run(_spawn_then_hang_on_1, timeout_s=2)
            pids = [int(p) for r in (0, 1) for p in (tmp_path / f"rank{r}").read_text().split()]
            assert len(pids) == 4 and _wait_gone(pids) == []
            assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [1.0, 1.0]  # and the pool recovers
    finally:
        _kill_leftovers(pids)


# ----------------------------------------------------------------------------- threaded backend


@pytest.mark.multiprocess
def test_threaded_backend_runs_collectives_and_recovers():
    from distcheck.runners import RankPool

    with RankPool(32, backend="threaded", timeout_s=30) as pool:
        res = pool.run(_allreduce_rank_plus, 1)
        assert [r[0] for r in res] == [float(sum(range(32)) + 32)] * 32
        assert {r[3] for r in res} == {"threaded"} and len({r[4] for r in res}) == 1  # one host process
        draws = pool.run(_draws)
        assert len({tuple(d) for d in draws}) == 32  # rank_generator: independent per rank
        assert pool.run(_draws) == draws  # and reproducible
    with RankPool(4, backend="threaded", timeout_s=30) as pool:
        with pytest.raises(RankFailure) as info:
            pool.run(_raise_on_1)
        assert info.value.rank == 1 and "bad value on rank 1" in info.value.traceback_text
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [6.0] * 4
        t0 = time.monotonic()
        with pytest.raises(WorldTimeout) as info:
            pool.run(_hang_on_1, timeout_s=1.0)
        assert time.monotonic() - t0 < 1.0 + 4
        assert "_sleep_forever" in info.value.stacks[1]
        assert [r[0] for r in pool.run(_allreduce_rank_plus, 0)] == [6.0] * 4


# ----------------------------------------------------------------------------- fake backend


def test_fake_world_builds_a_16384_rank_mesh():
    from distcheck.engine.fake import FakeWorld, run_fake

    assert run_fake(_mesh_layout, world_size=16_384, rank=9_000) == ((70, 40), 128, 128)
    assert FakeWorld(16_384).run(_mesh_layout, ranks=[0, 16_383]) == [((0, 0), 128, 128), ((127, 127), 128, 128)]
    with pytest.raises(ConfigError):
        run_fake(_mesh_layout, world_size=4, rank=4)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the fake group is gone afterwards


# ----------------------------------------------------------------------------- spawn (the NCCL start method)


@pytest.mark.multiprocess
def test_spawned_world_runs_and_is_reaped():
    """Spawn is what NCCL pools use (CUDA cannot fork); checked here on gloo, where it can run anywhere."""
    from distcheck.runners import RankPool

    pool = RankPool(2, timeout_s=120, start_method="spawn")
    try:
        res = pool.run(_allreduce_rank_plus, 1)
        pids = pool.pids
        assert [r[0] for r in res] == [3.0, 3.0] and sorted(r[4] for r in res) == sorted(pids)
        with pytest.raises(RankFailure) as info:
            pool.run(_raise_on_1)
        assert info.value.rank == 1 and "bad value on rank 1" in info.value.traceback_text
    finally:
        pool.close()
    assert not any(_alive(p) for p in pids)


def test_world_size_beyond_one_host_is_refused_before_anything_starts():
    from distcheck.runners import RankPool
    from distcheck.runners.pool import MAX_LOCAL_RANKS

    before = mp.active_children()
    with pytest.raises(ConfigError) as info:
        RankPool(MAX_LOCAL_RANKS["gloo"] + 1, backend="gloo")
    assert info.value.field == "world_size" and "threaded" in str(info.value)
    with pytest.raises(ConfigError, match="world_size=1025 must be <= 1024"):
        RankPool(1025, backend="threaded")
    assert mp.active_children() == before


# ----------------------------------------------------------------------------- start-up deadline


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["gloo", "threaded"])
def test_start_up_honours_timeout_and_names_the_ranks_that_did_not_come_up(backend, monkeypatch):
    """Children are forked, so a patched init_process_group in this process is theirs too."""
    import torch.distributed as dist

    from distcheck.runners import RankPool

    global _REAL_INIT
    _REAL_INIT = dist.init_process_group
    monkeypatch.setattr(dist, "init_process_group",
                        _hang_rank_1_at_init if backend == "threaded" else _hang_every_rank_at_init)
    pool = RankPool(4, backend=backend, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(WorldTimeout) as info:
        pool.start()
    elapsed = time.monotonic() - t0
    pool.close()
    # threaded: rank 1 hangs and ranks 0, 2, 3 wait for it in the store barrier, as the host's own
    # per-thread report shows; gloo: every rank hangs
    assert info.value.ranks == [0, 1, 2, 3] and "did not come up" in str(info.value)
    assert "_sleep_forever" in info.value.stacks[1]
    if backend == "threaded":
        assert info.value.stacks[1].startswith("Thread rank-1 (most recent call last)")
        assert "_store_based_barrier" in info.value.stacks[0] and "_sleep_forever" not in info.value.stacks[0]
    assert elapsed < 1.0 + 2.5  # timeout_s + the stack dump (the threaded host used to get 5 s more)


# ----------------------------------------------------------------------------- temporary folders


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_folders_of_dead_owners(tmp_path):
    from distcheck.runners.folders import sweep_stale_folders
    from distcheck.runners.pool import _owner_line

    me = _owner_line(os.getpid()).split()
    lines = {
        "dead": f"{_dead_pid()} - {me[2]} {me[3]}",
        "reused": f"{os.getpid()} 1 {me[2]} {me[3]}",  # this pid, but a process that started at another time
        "live": " ".join(me),
        "elsewhere": f"{_dead_pid()} - another-host {me[3]}",  # a /tmp shared with another machine or container
        "garbled": "not a marker",
    }
    for name, line in lines.items():
        (tmp_path / f"distcheck-pool-{name}").mkdir()
        (tmp_path / f"distcheck-pool-{name}" / "owner").write_text(line + "\n")
    (tmp_path / "distcheck-pool-nomarker").mkdir()  # being created right now, or an older version's
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "owner").write_text(lines["dead"])
    removed = sweep_stale_folders(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == ["distcheck-pool-dead", "distcheck-pool-reused"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "distcheck-pool-elsewhere", "distcheck-pool-garbled", "distcheck-pool-live", "distcheck-pool-nomarker",
        "unrelated"]


@pytest.mark.multiprocess
def test_the_next_pool_sweeps_folders_of_dead_owners(tmp_path, monkeypatch):
    """The backstop where no guard removed a dead parent's folder (off Linux, or a guard killed with it)."""
    import tempfile

    from distcheck.runners import RankPool
    from distcheck.runners.pool import _owner_line

    me = _owner_line(os.getpid()).split()
    for name, line in {"dead": f"{_dead_pid()} - {me[2]} {me[3]}", "live": " ".join(me)}.items():
        (tmp_path / f"distcheck-pool-{name}").mkdir()
        (tmp_path / f"distcheck-pool-{name}" / "owner").write_text(line + "\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with RankPool(1, backend="gloo", timeout_s=30) as pool:
        own = pool._world.tmpdir
        assert os.path.dirname(own) == str(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["distcheck-pool-live", os.path.basename(own)])  # the dead owner's folder is gone
        with open(os.path.join(own, "owner")) as f:
            assert f.read().split()[0] == str(os.getpid())
        assert not os.path.exists(os.path.join(own, "owner.partial"))
    assert not os.path.exists(own)
