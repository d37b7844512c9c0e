"""The one stage orchestration of ``distcheck check`` (distcheck.stages): both launchers, the extension points.

A stage is plugged in the two ways a later package would: one more ``Stage`` in
``stages.STAGES``, and a ``<package>.<name>.checks`` module found by discovery
(``stages.PARALLEL_PACKAGE`` points at a package written into ``tmp_path``). It then
runs through the unchanged command line on local gloo pools, and under a stub of the
torchrun world, which records what each rank does and when.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import textwrap
from types import SimpleNamespace

import pytest

from distcheck import stages
from distcheck.core.errors import BackendUnavailable, ConfigError, RankFailure
from distcheck.engine.world import RankContext
from distcheck.report import FAIL, PASS, CheckResult

CHECKS_MODULE = '''
import os

from distcheck.report import FAIL, PASS, CheckResult

STAGE = "echo"
PRELOAD = ("json",)


def _where(ctx, tag):
    return (ctx.rank, ctx.world_size, ctx.backend, tag, os.getpid())


def world_rows(world, *, timeout_s):
    same = world.run(_where, "same")
    own = world.run_on(_where, [("r%d" % r,) for r in range(world.world_size)])
    n = world.world_size
    ok = ([s[:4] for s in same] == [(r, n, world.backend, "same") for r in range(n)]
          and [o[3] for o in own] == ["r%d" % r for r in range(n)] and timeout_s == 45.0)
    return [CheckResult("alpha.where", world.backend, PASS if ok else FAIL, n, 2,
                        detail="pids " + " ".join(str(s[4]) for s in same))]


def world_free_rows():
    return [CheckResult("alpha.world_free", "fake", PASS, 16, 1, detail="needs no world")]
'''


@pytest.fixture
def plugged(tmp_path, monkeypatch):
    """A package ``<name>`` with ``alpha/checks.py`` (joins stage "echo"), ``beta/`` (no checks) and a
    plain module; a declared world stage "echo" with no checks of its own; discovery pointed at it."""
    name = "plugged_" + tmp_path.name.replace("-", "_")
    root = tmp_path / name
    (root / "alpha").mkdir(parents=True)
    (root / "beta").mkdir()
    (root / "__init__.py").write_text("")
    (root / "alpha" / "__init__.py").write_text("")
    (root / "alpha" / "checks.py").write_text(textwrap.dedent(CHECKS_MODULE))
    (root / "beta" / "__init__.py").write_text("")
    (root / "plain.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(stages, "PARALLEL_PACKAGE", name)
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES, stages.Stage("echo", "echo on {backend}", needs_world=True)))
    return name


# ----------------------------------------------------------------------------- declaring and finding stages


def test_stages_are_declared_once_in_order():
    assert stages.stage_names() == ("properties", "golden", "distributed", "layers", "certify")
    assert stages.stage_names(needs_world=True) == ("distributed", "layers")
    assert stages.stage_names(needs_world=False) == ("properties", "golden", "certify")
    table = {s.name: s for s in stages.stage_table()}  # the world stages' checks are discovered
    assert table["distributed"].preload == ("torch._dynamo", "torch.nn.parallel")
    assert [c.name for c in table["distributed"].checks] == ["dp"]
    assert {"comm", "layout", "pp", "tp", "zero"} <= {c.name for c in table["layers"].checks}
    assert table["layers"].label(stages.CheckOptions(backend="threaded")) == "layers on threaded"


def test_selection_keeps_declared_order_and_drops_world_stages_without_a_backend():
    names = [s.name for s in stages.select_stages(["layers", "properties"], None, "gloo")]
    assert names == ["properties", "layers"]
    # certify stays (a pure stage), and gives no rows without a backend
    assert [s.name for s in stages.select_stages(None, ["golden"], "none")] == ["properties", "certify"]
    with pytest.raises(ConfigError) as info:
        stages.select_stages(["layer"], None, "gloo")
    assert info.value.field == "only"


def test_a_stage_must_be_either_pure_or_on_worlds():
    with pytest.raises(ConfigError):
        stages.Stage("x", "x")  # pure, but nothing to run
    with pytest.raises(ConfigError):
        stages.Stage("x", "x", needs_world=True, run=lambda options: [])


def test_discovery_finds_checks_modules_and_joins_them_to_their_stage(plugged):
    found = stages.discover_checks()
    assert [(stage, c.name, c.preload) for stage, c in found] == [("echo", "alpha", ("json",))]
    echo = {s.name: s for s in stages.stage_table()}["echo"]
    assert [c.name for c in echo.checks] == ["alpha"] and echo.preload == ("json",)
    assert stages.discover_checks("no_such_package_here") == []


@pytest.mark.parametrize("body, field", [
    ("X = 1\n", "checks"),                                            # neither world_rows nor world_free_rows
    ("STAGE = 'golden'\ndef world_rows(world, *, timeout_s):\n    return []\n", "STAGE"),  # a pure stage
])
def test_a_malformed_checks_module_is_refused_not_skipped(plugged, tmp_path, body, field):
    (tmp_path / plugged / "gamma").mkdir()
    (tmp_path / plugged / "gamma" / "__init__.py").write_text("")
    (tmp_path / plugged / "gamma" / "checks.py").write_text(body)
    with pytest.raises(ConfigError) as info:
        stages.discover_checks()
    assert info.value.field.startswith(f"{plugged}.gamma.checks") and info.value.field.endswith(field)


# ----------------------------------------------------------------------------- the local launcher


@pytest.mark.multiprocess
def test_a_plugged_stage_runs_through_the_unchanged_command_line(plugged, capsys):
    from distcheck.cli import main

    code = main(["check", "--only", "echo", "--world-sizes", "1,2", "--timeout", "45", "--format", "json", "--quiet"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(r["check"], r["backend"], r["world_size"], r["verdict"]) for r in rows] == [
        ("alpha.world_free", "fake", 16, "pass"),  # world-free rows first, once
        ("alpha.where", "gloo", 1, "pass"),
        ("alpha.where", "gloo", 2, "pass"),
    ]


CERTIFYING_MODULE = '''
from hypothesis import strategies as st

from distcheck.engine.contracts.contract import Contract, ContractRun, Outcome, PropertySpec, register_contract
from distcheck.engine.contracts.targets import make_target, resolve

STAGE = "echo"


def echo(ctx, n):
    return n * ctx.world_size


def off_by_one_on_rank_1(ctx, n):
    return n * ctx.world_size + (ctx.rank == 1)


class Scaled(Contract):
    name = "zz-scaled"
    min_world_size = 1
    min_world_reason = "n times the world size can be wrong on any world, one rank included"
    parallelism = "echo"
    properties = (PropertySpec("value", "every rank returns n times the world size", "exact"),)
    dtypes = ("float64",)

    def resolve(self, obj, ref, options):
        return make_target(obj, ref, "function"), options

    def cases(self, world_size, dtype, options):
        return st.integers(0, 50)

    def run_rank(self, ctx, target, case, dtype, options):
        return resolve(target)(ctx, case)

    def check(self, case, results, world_size, dtype, options):
        bad = tuple(r for r, got in enumerate(results) if got != case * world_size)
        return {"value": Outcome(not bad, message=f"n={case}: ranks {list(bad)} returned {results}", ranks=bad)}


register_contract(Scaled())
CERTIFY = (ContractRun("gamma.echo", "zz-scaled", __name__ + ":echo"),
           ContractRun("gamma.off_by_one", "zz-scaled", __name__ + ":off_by_one_on_rank_1"))
'''


@pytest.mark.multiprocess
def test_a_checks_module_certifies_its_contract_runs_through_the_stage(plugged, tmp_path, capsys, monkeypatch):
    """CERTIFY: each run is certified on every world of the stage, Hypothesis-driven, one row per property
    with its example count; a wrong target is a FAIL row with the shrunk case and the replay command."""
    from distcheck.cli import main
    from distcheck.engine.contracts import contract

    contract.contracts()  # discover into the real registry first: the copy below then leaves it whole
    monkeypatch.setattr(contract, "_REGISTRY", dict(contract._REGISTRY))  # the test's contract leaves with it

    (tmp_path / plugged / "gamma").mkdir()
    (tmp_path / plugged / "gamma" / "__init__.py").write_text("")
    (tmp_path / plugged / "gamma" / "checks.py").write_text(textwrap.dedent(CERTIFYING_MODULE))
    code = main(["check", "--only", "echo", "--world-sizes", "2", "--timeout", "45", "--format", "json", "--quiet",
                 "--profile", "ci"])
    rows = {(r["check"], r["world_size"]): r for r in json.loads(capsys.readouterr().out)}
    assert code == 1
    ok, bad = rows[("gamma.echo.value", 2)], rows[("gamma.off_by_one.value", 2)]
    assert ok["verdict"] == "pass" and ok["examples"] == 10  # the ci profile's world-level count
    assert bad["verdict"] == "FAIL" and "n=0: ranks [1] returned [0, 1]" in bad["detail"]  # shrunk to n = 0
    assert f"distcheck certify {plugged}.gamma.checks:off_by_one_on_rank_1 --contract zz-scaled" in bad["detail"]


def test_world_level_examples_follow_the_profile(monkeypatch):
    from distcheck.certify import runs
    from distcheck.engine import profiles
    from distcheck.engine.contracts.contract import ContractRun

    assert profiles.WORLD_MAX_EXAMPLES == {"dev": 10, "ci": 10, "thorough": 100}
    seen = {}

    def fake_certify(target, contract, **kwargs):
        seen[kwargs["profile"]] = kwargs["examples"]
        raise StopIteration

    monkeypatch.setattr("distcheck.certify.engine.certify", fake_certify)
    for profile in ("ci", "thorough"):
        with pytest.raises(StopIteration):
            runs.contract_rows(SimpleNamespace(world_size=2, backend="gloo"), [ContractRun("x", "y", "m:z")],
                               profile=profile)
    assert seen == {"ci": 10, "thorough": 100}
    for profile in ("ci", "thorough"):  # a run's max_examples caps the profile's count, never raises it
        with pytest.raises(StopIteration):
            runs.contract_rows(SimpleNamespace(world_size=2, backend="gloo"),
                               [ContractRun("x", "y", "m:z", max_examples=2 if profile == "ci" else 200)],
                               profile=profile)
    assert seen == {"ci": 2, "thorough": 100}


def _pids(ctx):
    return os.getpid()


def _pid_stage(name):
    def rows(world, options):
        return [CheckResult(name, world.backend, PASS, world.world_size, 1,
                            detail=" ".join(map(str, world.run(_pids))))]

    return stages.Stage(name, name, needs_world=True, checks=(stages.WorldChecks(name, world_rows=rows),))


@pytest.mark.multiprocess
def test_world_stages_share_one_pool_per_world_size_and_close_it():
    options = stages.CheckOptions(backend="gloo", world_sizes=(2, 3), timeout_s=60.0)
    rows = stages.run_stages([_pid_stage("first"), _pid_stage("second")], options)
    by = {(r.check, r.world_size): r.detail.split() for r in rows}
    assert [(r.check, r.world_size) for r in rows] == [("first", 2), ("first", 3), ("second", 2), ("second", 3)]
    assert by[("first", 2)] == by[("second", 2)] and len(set(by[("first", 2)])) == 2  # the same ranks
    assert by[("first", 3)] == by[("second", 3)] and set(by[("first", 3)]).isdisjoint(by[("first", 2)])
    ranks = {int(p) for v in by.values() for p in v}
    assert not ranks & {c.pid for c in mp.active_children()}  # every pool was closed on the way out


def _raise_on_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 refuses")
    return ctx.rank


@pytest.mark.multiprocess
def test_a_failing_stage_is_one_fail_row_and_the_next_stage_still_runs():
    def failing(world, options):
        world.run(_raise_on_1)  # RankFailure: a DistcheckError
        return []

    broken = stages.Stage("broken", "broken on {backend}", needs_world=True,
                          checks=(stages.WorldChecks("broken", world_rows=failing),))
    rows = stages.run_stages([broken, _pid_stage("after")], stages.CheckOptions(world_sizes=(2,), timeout_s=60.0))
    assert [(r.check, r.verdict) for r in rows] == [("broken on gloo", FAIL), ("after", PASS)]
    assert rows[0].detail == "rank 1 failed:"  # the first line of the labelled RankFailure


def test_a_backend_that_cannot_run_gives_the_checks_skip_rows(plugged):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: nccl would run")
    from distcheck.runners import check_backend_available

    with pytest.raises(BackendUnavailable) as why:
        check_backend_available("nccl", 1)
    echo = {s.name: s for s in stages.stage_table()}["echo"]
    rows = stages.run_stages([echo], stages.CheckOptions(backend="nccl", world_sizes=(1,)))
    assert [(r.check, r.backend, r.world_size, r.verdict) for r in rows] == [
        ("alpha.world_free", "fake", 16, "pass"), ("alpha", "nccl", 1, "skip")]
    assert rows[1].detail == str(why.value)  # the reason, decided before anything started


# ----------------------------------------------------------------------------- the torchrun launcher, stubbed


class StubWorld:
    """One rank of a launched world, in this process: records every call, shares rank 0's value."""

    backend = "gloo"

    def __init__(self, rank, world_size, events, rank0_value=None):
        self.rank, self.world_size, self.events, self.rank0_value = rank, world_size, events, rank0_value

    def start(self):
        self.events.append("start")
        return self

    def close(self):
        self.events.append("close")

    def _ctx(self):
        return RankContext(rank=self.rank, world_size=self.world_size, backend=self.backend, device="cpu")

    def run(self, fn, *args, timeout_s=None):
        self.events.append("run")
        mine = fn(self._ctx(), *args)
        return [mine if r == self.rank else (r, self.world_size, self.backend, *mine[3:])
                for r in range(self.world_size)]

    def run_on(self, fn, args_per_rank, timeout_s=None):
        self.events.append("run_on")
        mine = fn(self._ctx(), *args_per_rank[self.rank])
        return [mine if r == self.rank else (r, self.world_size, self.backend, *args_per_rank[r], *mine[4:])
                for r in range(self.world_size)]

    def rank0_broadcaster(self, timeout_s=3600.0):
        self.events.append(f"side group {timeout_s:g}")

        def share(value):
            self.events.append(f"share {value}")
            return value if self.rank == 0 else self.rank0_value

        return share


def _note(events):
    def run(options):
        events.append("pure stage")
        return [CheckResult("note", "-", PASS, 1, 1, detail=f"seed {options.seed}, profile {options.profile}")]

    return stages.Stage("note", "note", run=run)


def test_a_plugged_stage_runs_under_torchrun_rank_0(plugged, monkeypatch, capsys):
    events: list[str] = []
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES, _note(events)))
    args = SimpleNamespace(backend="gloo", timeout=45.0, format="json", only=["echo", "note"], skip=[], seed=7,
                           profile="dev")
    code = stages.run_torchrun(args, world=StubWorld(0, 2, events))
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(r["check"], r["world_size"], r["verdict"]) for r in rows] == [
        ("alpha.world_free", 16, "pass"), ("alpha.where", 2, "pass"), ("note", 1, "pass")]
    assert rows[2]["detail"] == "seed 7, profile dev"
    # world-free rows before joining; the side group right after; pure stages after the world stages
    assert events == ["start", "side group 3600", "run", "run_on", "pure stage", "share 0", "close"]


def test_other_ranks_run_only_the_world_stages_print_nothing_and_return_rank_0s_code(plugged, monkeypatch, capsys):
    events: list[str] = []
    monkeypatch.setattr(stages, "STAGES", (*stages.STAGES, _note(events)))
    args = SimpleNamespace(backend="gloo", timeout=45.0, format="json", only=["echo", "note"], skip=[])
    code = stages.run_torchrun(args, world=StubWorld(1, 2, events, rank0_value=1))
    assert code == 1  # rank 0's code, although every row of rank 1 passed
    assert capsys.readouterr().out == ""
    assert events == ["start", "side group 3600", "run", "run_on", "share 0", "close"]


def test_a_failed_exit_code_exchange_fails_every_rank(plugged, capsys):
    class Broken(StubWorld):
        def rank0_broadcaster(self, timeout_s=3600.0):
            def share(value):
                raise RuntimeError("side group timed out")

            return share

    args = SimpleNamespace(backend="gloo", timeout=45.0, format="json", only=["echo"], skip=[])
    assert stages.run_torchrun(args, world=Broken(0, 2, [])) == 1
    rows = json.loads(capsys.readouterr().out)
    assert (rows[-1]["check"], rows[-1]["verdict"], rows[-1]["detail"]) == (
        "torchrun.exit_code_exchange", "FAIL", "side group timed out")


# ----------------------------------------------------------------------------- the torchrun world's run_on


def test_torchrun_world_run_on_checks_its_arguments_before_joining():
    from distcheck.runners import TorchrunWorld

    world = TorchrunWorld(backend="gloo", environ={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    for bad, field in (([(1,)], "args_per_rank"), ([(1,), 2], "args_per_rank[1]"), ("ab", "args_per_rank")):
        with pytest.raises(ConfigError) as info:
            world.run_on(_pids, bad)
        assert info.value.field == field
    assert world._ctx is None  # nothing was joined


def _run_on_inside(ctx):
    from distcheck.runners import TorchrunWorld

    env = {"RANK": str(ctx.rank), "WORLD_SIZE": str(ctx.world_size), "LOCAL_RANK": str(ctx.rank)}
    world = TorchrunWorld(backend="gloo", timeout_s=30, environ=env)
    got = world.run_on(_tagged, [("a",), ("b",)])
    share = world.rank0_broadcaster(30)
    shared = share(f"from rank {ctx.rank}")
    try:
        world.run_on(_raise_on_1_tagged, [("a",), ("b",)])
        failure = None
    except RankFailure as exc:
        failure = (exc.rank, "rank 1 refuses b" in exc.traceback_text)
    world.close()
    return got, shared, failure


def _tagged(ctx, tag):
    return f"{ctx.rank}:{tag}"


def _raise_on_1_tagged(ctx, tag):
    if ctx.rank == 1:
        raise ValueError(f"rank 1 refuses {tag}")
    return tag


@pytest.mark.multiprocess
def test_torchrun_world_run_on_gives_each_rank_its_arguments_and_shares_rank_0s_value():
    from distcheck.runners import RankPool

    with RankPool(2, timeout_s=60) as pool:
        res = pool.run(_run_on_inside)
    for got, shared, failure in res:
        assert got == ["0:a", "1:b"]
        assert shared == "from rank 0"
        assert failure == (1, True)
