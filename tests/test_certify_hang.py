"""A target that hangs fails once, at the first step that times out, with every stuck rank's stack;
the rest of that target is skipped ("a previous property hung") and its worlds are not started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.certify.engine import HUNG_REASON, certify
from distcheck.errors import WorldTimeout
from tests.addition_contract import AdditionContract, Pair
from tests.addition_contract import good_add as add

ROOT = Path(__file__).resolve().parent.parent
HANGING = "examples.hanging_layers:RowParallelSleeps"


def _sleep_line() -> str:
    """``hanging_layers.py", line N``: the frame a stuck rank's stack names (faulthandler's dump of a gloo rank
    writes ``line N in forward``, a threaded rank's traceback ``line N, in forward``)."""
    source = (ROOT / "examples" / "hanging_layers.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "time.sleep(" in text)
    return f'hanging_layers.py", line {line}'


# ----------------------------------------------------------------------------- in process (a world that times out)


class TwoPropertyContract(AdditionContract):
    """The addition contract in two dtypes, on a world (the fake ones below, whose steps time out)."""

    name = "test-hang"
    needs_world = True
    dtypes = ("float64", "float32")


class HangsOnSeven:
    """A world of 2 ranks whose step times out, as a pool reports it, when the case holds a 7."""

    world_size, backend = 2, "fake"

    def __init__(self):
        self.timeouts = 0
        self.steps = 0

    def run(self, fn, contract, target, case, *rest):
        self.steps += 1
        if 7 in (case.a, case.b):
            self.timeouts += 1
            stacks = {r: f'  File "layer.py", line 12 in forward (rank {r})\n' for r in (0, 1)}
            raise WorldTimeout("step did not finish within timeout_s=3 on backend 'fake': ranks [0, 1] stuck",
                               ranks=[0, 1], stacks=stacks, timeout_s=3.0)
        return [fn(None, contract, target, case, *rest) for _ in range(2)]


def test_a_timeout_fails_one_property_with_the_stacks_and_skips_the_rest():
    world = HangsOnSeven()
    cert = certify(add, TwoPropertyContract(), world=world, examples=200, seed=5)
    assert world.timeouts == 1  # no replay, no shrink: each would wait out the timeout again
    first, *rest = cert.verdicts
    assert (first.property, first.dtype, first.verdict, first.hung) == ("sum", "float64", "FAIL", True)
    assert first.ranks == [0, 1] and "timed out" in first.failure and "7" in first.counterexample
    assert first.examples == world.steps  # the step that hung was the last one run
    text = first.describe("test-hang")
    assert "--- rank 0 ---" in text and "--- rank 1 ---" in text and "(rank 1)" in text
    assert [(v.property, v.dtype, v.verdict) for v in rest] == [
        ("symmetric", "float64", "skip"), ("sum", "float32", "skip"), ("symmetric", "float32", "skip")]
    assert all(v.failure.startswith(HUNG_REASON) and "test-hang.sum[float64]" in v.failure for v in rest)
    assert not cert.ok


def test_verdicts_before_the_hang_are_kept():
    class HangsInFloat32(HangsOnSeven):
        def run(self, fn, contract, target, case, dtype, options):
            return super().run(fn, contract, target, Pair(7, 7) if dtype == "float32" else case, dtype,
                               options)

    world = HangsInFloat32()
    cert = certify(add, TwoPropertyContract(), world=world, examples=10, seed=5)
    assert world.timeouts == 1
    assert [(v.property, v.dtype, v.verdict, v.examples) for v in cert.verdicts] == [
        ("sum", "float64", "pass", 10), ("symmetric", "float64", "pass", 10),
        ("sum", "float32", "FAIL", 1), ("symmetric", "float32", "skip", 0)]


def test_a_hang_while_shrinking_a_failure_fails_that_property_and_keeps_the_failure():
    class FailsThenHangs(HangsOnSeven):  # the first 16 fails sum; the next step (a shrink) hangs
        failed = False

        def run(self, fn, contract, target, case, *rest):
            if self.failed:
                return super().run(fn, contract, target, Pair(7, 7), *rest)
            if case.a + case.b >= 16:
                self.failed = True
                return [((case.a + case.b) % 16, case.b + case.a)] * 2
            return super().run(fn, contract, target, case, *rest)

    world = FailsThenHangs()
    cert = certify(add, TwoPropertyContract(), world=world, examples=200, seed=5, dtypes=["float64"])
    assert world.failed and world.timeouts == 1
    by = {v.property: v for v in cert.verdicts}
    assert by["sum"].verdict == "FAIL" and by["sum"].hung
    assert "before that, it had failed on Pair(" in by["sum"].failure
    assert by["symmetric"].verdict == "skip" and by["symmetric"].failure.startswith(HUNG_REASON)


def test_certify_help_states_the_default_step_timeout():
    from distcheck.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    text = " ".join(sub.choices["certify"].format_help().split())
    assert "--timeout SECONDS seconds one world step" in text and "default 120" in text
    assert "fails the target as hung" in text


# ----------------------------------------------------------------------------- real worlds


def _rank_of(ctx):
    return ctx.rank


class _Counting:
    """A borrowed pool that counts the steps that timed out."""

    def __init__(self, pool):
        self.pool, self.timeouts = pool, 0
        self.world_size, self.backend = pool.world_size, pool.backend

    def run(self, fn, *args, timeout_s=None):
        try:
            return self.pool.run(fn, *args, timeout_s=timeout_s)
        except WorldTimeout:
            self.timeouts += 1
            raise


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["gloo", "threaded"])
def test_a_hanging_layer_times_out_once_and_the_pool_is_reaped(backend):
    pytest.importorskip("torch")
    from distcheck.runners.pool import RankPool

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with RankPool(2, backend=backend, timeout_s=3) as pool:
        pids = pool.pids
        counting = _Counting(pool)
        cert = certify(HANGING, "row-parallel-linear", world=counting, examples=5, seed=1,
                       dtypes=["float64", "float32"])
        assert counting.timeouts == 1
        hung = [v for v in cert.verdicts if v.hung]
        assert len(hung) == 1 and hung[0].verdict == "FAIL" and sorted(hung[0].stacks) == [0, 1]
        assert all(_sleep_line() in stack for stack in hung[0].stacks.values())
        others = [v for v in cert.verdicts if not v.hung]
        assert len(others) == 9 and all(v.verdict == "skip" and v.failure.startswith(HUNG_REASON) for v in others)
        assert not pool.running  # the stuck world was torn down ...
        for pid in pids:  # ... and its processes reaped
            assert not os.path.exists(f"/proc/{pid}"), pid
        assert pool.run(_rank_of) == [0, 1]  # and the pool starts a fresh world


@pytest.mark.multiprocess
def test_cli_hang_fails_once_with_the_stacks_in_the_output_and_the_certificate(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "distcheck", "certify", HANGING, "--contract", "row-parallel-linear",
           "--timeout", "3", "--world-sizes", "2,3", "--dtypes", "float64,float32", "--examples", "5",
           "--certificate", str(tmp_path / "c.json"), "--certificate", str(tmp_path / "c.md")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("Stacks of the stuck ranks:") == 1
    assert "--- rank 0 ---" in out and "--- rank 1 ---" in out and out.count(_sleep_line()) == 2
    assert "0 passed, 1 failed, 19 skipped" in out

    data = json.loads((tmp_path / "c.json").read_text())
    cert = data["certifications"][0]
    assert cert["world_sizes"] == [2, 3]  # world size 3 recorded, never started
    failed = [v for v in cert["verdicts"] if v["verdict"] == "FAIL"]
    assert len(failed) == 1 and failed[0]["hung"] and "timeout_s=3" in failed[0]["failure"]
    assert sorted(failed[0]["stacks"]) == ["0", "1"] and all(_sleep_line() in s for s in failed[0]["stacks"].values())
    skipped = [v for v in cert["verdicts"] if v["verdict"] != "FAIL"]
    assert len(skipped) == 19 and {v["verdict"] for v in skipped} == {"skip"}
    assert all(v["failure"].startswith(HUNG_REASON) for v in skipped)
    assert {v["world_size"] for v in skipped} == {2, 3}
    md = (tmp_path / "c.md").read_text()
    assert "--- rank 1 ---" in md and _sleep_line() in md and md.count(HUNG_REASON) == 19


@pytest.mark.multiprocess
def test_the_configs_timeout_and_defaults_apply_to_a_target_given_on_the_command_line(tmp_path):
    # --config with a target used to be ignored: the step waited out the default 120 s
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.distcheck]\ntimeout = 3\nworld-sizes = [2]\ndtypes = ["float64"]\nexamples = 2\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "distcheck", "certify", HANGING, "--contract", "row-parallel-linear",
           "--config", str(config), "--certificate", str(tmp_path / "c.json")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"the config's timeout (3 s) was not applied:\n{out[-2000:]}{err[-2000:]}")
    assert proc.returncode == 1, out + err
    cert = json.loads((tmp_path / "c.json").read_text())["certifications"][0]
    assert cert["world_sizes"] == [2] and cert["dtypes"] == ["float64"]
    failed = [v for v in cert["verdicts"] if v["verdict"] == "FAIL"]
    assert len(failed) == 1 and failed[0]["hung"] and "timeout_s=3" in failed[0]["failure"]
    # a flag overrides the file
    proc = subprocess.run([*cmd[:-2], "--timeout", "2", "--format", "json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1 and "timeout_s=2" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
