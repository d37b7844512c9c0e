"""Every public argument of the runners is checked at the boundary: one table, one ConfigError per row.

Each row is a call with one bad argument and the field the ConfigError must name.
Nothing may start: the rows run before any world exists (the pool's rows are
checked against ``multiprocessing.active_children()``). The last tests cover the
command-line timeout, whose range is the library's.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from types import SimpleNamespace

import pytest

from distcheck.core.errors import ConfigError
from distcheck.engine.fake import FakeWorld, run_fake
from distcheck.engine.world import RankContext, check_same_shape
from distcheck.runners import RankPool, TorchrunWorld
from distcheck.runners.backends import MAX_TIMEOUT_S
from distcheck.runners.threaded import rank_generator, threaded_pool
from distcheck.runners.torchrun import run_check_under_torchrun

ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


def _rank_fn(ctx):
    return ctx.rank


def _pool(**kwargs):
    return RankPool(2, **kwargs)


def _ctx():
    return RankContext(rank=0, world_size=2, backend="gloo", device="cpu")


def _torchrun_args(**kwargs):
    return SimpleNamespace(**{"backend": "gloo", "timeout": 60.0, "format": "json", "only": ["golden"], "skip": [],
                              **kwargs})


def _zeros():
    import torch

    return torch.zeros(2)


ROWS = [
    # ---- RankPool(...)
    ("pool world_size 0", lambda: RankPool(0), "world_size"),
    ("pool world_size float", lambda: RankPool(2.0), "world_size"),
    ("pool world_size bool", lambda: RankPool(True), "world_size"),
    ("pool world_size str", lambda: RankPool("2"), "world_size"),
    ("pool world_size beyond gloo", lambda: RankPool(65), "world_size"),
    ("pool backend unknown", lambda: _pool(backend="mpi"), "backend"),
    ("pool backend not a str", lambda: _pool(backend=1), "backend"),
    ("pool timeout 0", lambda: _pool(timeout_s=0), "timeout_s"),
    ("pool timeout negative", lambda: _pool(timeout_s=-1), "timeout_s"),
    ("pool timeout nan", lambda: _pool(timeout_s=math.nan), "timeout_s"),
    ("pool timeout inf", lambda: _pool(timeout_s=math.inf), "timeout_s"),
    ("pool timeout bool", lambda: _pool(timeout_s=True), "timeout_s"),
    ("pool timeout str", lambda: _pool(timeout_s="60"), "timeout_s"),
    ("pool timeout 1e10", lambda: _pool(timeout_s=1e10), "timeout_s"),
    ("pool timeout just over a day", lambda: _pool(timeout_s=MAX_TIMEOUT_S + 0.5), "timeout_s"),
    ("pool timeout huge int", lambda: _pool(timeout_s=10**400), "timeout_s"),
    ("pool start_method unknown", lambda: _pool(start_method="forkserver"), "start_method"),
    ("pool start_method not a str", lambda: _pool(start_method=1), "start_method"),
    ("pool nccl fork", lambda: RankPool(1, backend="nccl", start_method="fork"), "start_method"),
    ("pool preload a bare string", lambda: _pool(preload="torch"), "preload"),
    ("pool preload not a list", lambda: _pool(preload=5), "preload"),
    ("pool preload a set", lambda: _pool(preload={"torch"}), "preload"),
    ("pool preload non-str entry", lambda: _pool(preload=["torch", 3]), "preload[1]"),
    ("pool preload not a module name", lambda: _pool(preload=["torch", "not a module"]), "preload[1]"),
    ("pool preload empty name", lambda: _pool(preload=[""]), "preload[0]"),
    ("pool env not a dict", lambda: _pool(env=["A"]), "env"),
    ("pool env int value", lambda: _pool(env={"A": 1}), "env['A']"),
    ("pool env None value", lambda: _pool(env={"A": None}), "env['A']"),
    ("pool env NUL in value", lambda: _pool(env={"A": "x\0y"}), "env['A']"),
    ("pool env int key", lambda: _pool(env={1: "x"}), "env"),
    ("pool env key with =", lambda: _pool(env={"A=B": "x"}), "env"),
    ("pool env empty key", lambda: _pool(env={"": "x"}), "env"),
    # ---- RankPool.run / run_on (validated before a world starts)
    ("run fn not callable", lambda: _pool().run(5), "fn"),
    ("run timeout 1e10", lambda: _pool().run(_rank_fn, timeout_s=1e10), "timeout_s"),
    ("run timeout 0", lambda: _pool().run(_rank_fn, timeout_s=0), "timeout_s"),
    ("run timeout str", lambda: _pool().run(_rank_fn, timeout_s="5"), "timeout_s"),
    ("run_on fn not callable", lambda: _pool().run_on(None, [(), ()]), "fn"),
    ("run_on args a string", lambda: _pool().run_on(_rank_fn, "ab"), "args_per_rank"),
    ("run_on args an int", lambda: _pool().run_on(_rank_fn, 3), "args_per_rank"),
    ("run_on too few entries", lambda: _pool().run_on(_rank_fn, [()]), "args_per_rank"),
    ("run_on entry a string", lambda: _pool().run_on(_rank_fn, [(1,), "b"]), "args_per_rank[1]"),
    ("run_on entry an int", lambda: _pool().run_on(_rank_fn, [7, (1,)]), "args_per_rank[0]"),
    ("run_on timeout nan", lambda: _pool().run_on(_rank_fn, [(), ()], timeout_s=math.nan), "timeout_s"),
    ("preload not importable", lambda: _pool(preload=["distcheck_no_such_module"]).start(), "preload[0]"),
    # ---- threaded helpers
    ("threaded_pool world_size", lambda: threaded_pool(0), "world_size"),
    ("threaded_pool beyond 1024", lambda: threaded_pool(1025), "world_size"),
    ("threaded_pool timeout", lambda: threaded_pool(2, timeout_s=1e10), "timeout_s"),
    ("rank_generator seed float", lambda: rank_generator(_ctx(), 1.5), "seed"),
    ("rank_generator seed str", lambda: rank_generator(_ctx(), "5"), "seed"),
    ("rank_generator seed negative", lambda: rank_generator(_ctx(), -1), "seed"),
    ("rank_generator seed 2**32", lambda: rank_generator(_ctx(), 2**32), "seed"),
    ("rank_generator no rank", lambda: rank_generator(object(), 5), "ctx.rank"),
    ("check_same_shape what", lambda: check_same_shape(_ctx(), _zeros(), 3), "what"),
    # ---- fake backend
    ("run_fake fn", lambda: run_fake(5, world_size=4), "fn"),
    ("run_fake world_size 0", lambda: run_fake(_rank_fn, world_size=0), "world_size"),
    ("run_fake world_size float", lambda: run_fake(_rank_fn, world_size=4.0), "world_size"),
    ("run_fake world_size beyond 2**24", lambda: run_fake(_rank_fn, world_size=2**24 + 1), "world_size"),
    ("run_fake rank too large", lambda: run_fake(_rank_fn, world_size=4, rank=4), "rank"),
    ("run_fake rank negative", lambda: run_fake(_rank_fn, world_size=4, rank=-1), "rank"),
    ("run_fake rank bool", lambda: run_fake(_rank_fn, world_size=4, rank=True), "rank"),
    ("FakeWorld world_size 0", lambda: FakeWorld(0), "world_size"),
    ("FakeWorld world_size 2**31", lambda: FakeWorld(2**31), "world_size"),
    ("FakeWorld world_size str", lambda: FakeWorld("8"), "world_size"),
    ("FakeWorld.run fn", lambda: FakeWorld(4).run("f"), "fn"),
    ("FakeWorld.run ranks a string", lambda: FakeWorld(4).run(_rank_fn, ranks="01"), "ranks"),
    ("FakeWorld.run ranks an int", lambda: FakeWorld(4).run(_rank_fn, ranks=3), "ranks"),
    ("FakeWorld.run rank out of range", lambda: FakeWorld(4).run(_rank_fn, ranks=[0, 4]), "ranks[1]"),
    ("FakeWorld.run rank float", lambda: FakeWorld(4).run(_rank_fn, ranks=[1.0]), "ranks[0]"),
    # ---- torchrun
    ("torchrun backend threaded", lambda: TorchrunWorld(backend="threaded", environ=ENV), "backend"),
    ("torchrun backend not a str", lambda: TorchrunWorld(backend=0, environ=ENV), "backend"),
    ("torchrun timeout 0", lambda: TorchrunWorld(timeout_s=0, environ=ENV), "timeout_s"),
    ("torchrun timeout 1e10", lambda: TorchrunWorld(timeout_s=1e10, environ=ENV), "timeout_s"),
    ("torchrun timeout str", lambda: TorchrunWorld(timeout_s="600", environ=ENV), "timeout_s"),
    ("torchrun environ a string", lambda: TorchrunWorld(environ="RANK=0"), "environ"),
    ("torchrun RANK an int", lambda: TorchrunWorld(environ=dict(ENV, RANK=0)), "RANK"),
    ("torchrun RANK underscores", lambda: TorchrunWorld(environ=dict(ENV, WORLD_SIZE="1_0")), "WORLD_SIZE"),
    ("torchrun RANK non-ASCII digit", lambda: TorchrunWorld(environ=dict(ENV, RANK="\u0663")), "RANK"),
    ("torchrun RANK a float", lambda: TorchrunWorld(environ=dict(ENV, LOCAL_RANK="0.0")), "LOCAL_RANK"),
    ("torchrun run fn", lambda: TorchrunWorld(backend="gloo", environ=ENV).run(3), "fn"),
    ("torchrun run timeout", lambda: TorchrunWorld(backend="gloo", environ=ENV).run(_rank_fn, timeout_s=-5),
     "timeout_s"),
    ("check under torchrun backend", lambda: run_check_under_torchrun(_torchrun_args(backend="mpi"), environ=ENV),
     "backend"),
    ("check under torchrun timeout", lambda: run_check_under_torchrun(_torchrun_args(timeout=3e6), environ=ENV),
     "timeout_s"),
]


@pytest.mark.parametrize("call, field", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_argument_raises_config_error_naming_the_field(call, field):
    before = mp.active_children()
    with pytest.raises(ConfigError) as info:
        call()
    err = info.value
    assert err.field == field, str(err)
    assert str(err).startswith(f"{field}="), str(err)
    assert mp.active_children() == before  # refused before anything started


def test_good_arguments_are_kept_as_given():
    pool = RankPool(2, timeout_s=MAX_TIMEOUT_S, preload=["json", "os.path"], env={"GLOO_SOCKET_IFNAME": "lo"})
    assert pool.timeout_s == 86_400.0 and pool.preload == ("json", "os.path")
    assert pool.env == {"GLOO_SOCKET_IFNAME": "lo"}
    assert RankPool(2, timeout_s=0.25, preload=()).timeout_s == 0.25
    world = TorchrunWorld(environ={"RANK": " 3 ", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, timeout_s=5)
    assert (world.rank, world.world_size, world.local_rank, world.timeout_s) == (3, 8, 3, 5.0)


def test_rank_generator_is_seeded_from_seed_and_rank():
    assert rank_generator(_ctx(), 2**32 - 1).initial_seed() == (2**32 - 1) * 1_000_003
    ctx = RankContext(rank=3, world_size=4, backend="gloo", device="cpu")
    assert rank_generator(ctx, 5).initial_seed() == 5_000_018


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("value", ["3000000", "86400.5", "1e400", "nan", "0", "-1", "inf", "sixty"])
def test_cli_timeout_out_of_range_is_one_line_and_exit_2(value, capsys):
    from distcheck.cli import main

    with pytest.raises(SystemExit) as info:
        main(["check", "--timeout", value, "--only", "distributed"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "argument --timeout" in err and repr(value) in err


def test_cli_timeout_of_one_day_is_accepted():
    from distcheck.cli import build_parser

    args = build_parser().parse_args(["check", "--timeout", "86400"])
    assert args.timeout == 86_400.0


def test_torchrun_module_timeout_out_of_range_is_exit_2(capsys):
    from distcheck.runners.torchrun import main

    with pytest.raises(SystemExit) as info:
        main(["--timeout", "1e10"])
    assert info.value.code == 2
    assert "argument --timeout" in capsys.readouterr().err
