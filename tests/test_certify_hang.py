"""A target that hangs fails once, on the smallest case that times out (a hang is shrunk like any failure,
its later steps under a shorter timeout), with every stuck rank's stack; the rest of that target is skipped
("a previous property hung") and its worlds are not started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcheck.certify.engine import certify
from distcheck.certify.hangs import HUNG_REASON, MAX_SHRINK_HANGS, SHRINK_TIMEOUT_MIN_S, shrink_timeout
from distcheck.core.errors import WorldTimeout
from tests.addition_contract import AdditionContract, Pair
from tests.addition_contract import good_add as add

ROOT = Path(__file__).resolve().parent.parent
HANGING = "examples.hanging_layers:RowParallelSleeps"
HANGING_WHEN_WIDE = "examples.hanging_layers:RowParallelSleepsWhenWide"


def _sleep_line(which: int = 0) -> str:
    """``hanging_layers.py", line N``: the frame a stuck rank's stack names (faulthandler's dump of a gloo rank
    writes ``line N in forward``, a threaded rank's traceback ``line N, in forward``); ``which``: the class's
    ``time.sleep`` line, in the order of the file."""
    source = (ROOT / "examples" / "hanging_layers.py").read_text().splitlines()
    line = [i for i, text in enumerate(source, 1) if "time.sleep(" in text][which]
    return f'hanging_layers.py", line {line}'


# ----------------------------------------------------------------------------- in process (a world that times out)


class TwoPropertyContract(AdditionContract):
    """The addition contract in two dtypes, on a world (the fake ones below, whose steps time out)."""

    name = "test-hang"
    needs_world = True
    dtypes = ("float64", "float32")


class HangsOnSeven:
    """A world of 2 ranks whose step times out, as a pool reports it, when the case holds a 7 (its ``run``
    takes no ``timeout_s``: any object with ``run`` is a world)."""

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
    assert world.timeouts > 1  # shrunk: the steps that hung again while shrinking
    first, *rest = cert.verdicts
    assert (first.property, first.dtype, first.verdict, first.hung) == ("sum", "float64", "FAIL", True)
    assert first.ranks == [0, 1] and "timed out" in first.failure
    assert first.counterexample == "Pair(a=0, b=7)"  # the smallest case that hangs
    # every step, the shrinking included, but the warm-ups of the world after each hang but the last
    assert first.examples == world.steps - (world.timeouts - 1)
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
    assert [(v.property, v.dtype, v.verdict, v.examples) for v in cert.verdicts] == [
        ("sum", "float64", "pass", 10), ("symmetric", "float64", "pass", 10),
        ("sum", "float32", "FAIL", world.timeouts), ("symmetric", "float32", "skip", 0)]
    assert cert.verdicts[2].examples_until_failure == 1  # the first float32 step hung; the others shrank it


class HangsWhenWide:
    """A world of 2 ranks whose step times out after ``timeout_s`` (600 s, as a pool reports it) when ``a >= 5``;
    it records the timeout each step was given (None: the world's own)."""

    world_size, backend = 2, "fake"

    def __init__(self):
        self.given = []  # (case, timeout_s) of every step

    def run(self, fn, contract, target, case, *rest, timeout_s=None):
        self.given.append((case, timeout_s))
        if case.a >= 5:
            took = 600.0 if timeout_s is None else timeout_s
            stacks = {r: f'  File "layer.py", line 12 in forward (rank {r}, a={case.a}, b={case.b})\n' for r in (0, 1)}
            raise WorldTimeout(f"step did not finish within timeout_s={took:g} on backend 'fake': ranks [0, 1] stuck",
                               ranks=[0, 1], stacks=stacks, timeout_s=took)
        return [fn(None, contract, target, case, *rest) for _ in range(2)]


def test_a_hang_is_shrunk_to_the_smallest_case_that_hangs_under_a_shorter_timeout():
    world = HangsWhenWide()
    cert = certify(add, TwoPropertyContract(), world=world, examples=200, seed=5, dtypes=["float64"])
    hung = [v for v in cert.verdicts if v.hung]
    assert len(hung) == 1 and hung[0].verdict == "FAIL"
    assert hung[0].counterexample == "Pair(a=5, b=0)"  # the smallest case that hangs, not the first drawn
    assert all("a=5, b=0)" in text for text in hung[0].stacks.values())  # that case's stacks
    first = next(i for i, (case, _) in enumerate(world.given) if case.a >= 5)
    assert world.given[first][1] is None  # the first hang waited out the world's own timeout ...
    # ... after each hang the world is warmed with the run's first case that finished (the world's own timeout,
    # not counted as an example), and every other later step runs under the shorter timeout
    warm = world.given[0][0]
    later = world.given[first + 1:]
    warmups = [case for case, t in later if t is None]
    assert warmups and set(warmups) == {warm}
    assert {t for _, t in later if t is not None} == {SHRINK_TIMEOUT_MIN_S} == {shrink_timeout(600.0, 0.0)}
    # one warm-up after every hang but the last (nothing runs after it)
    assert len(warmups) == sum(c.a >= 5 for c, _ in world.given) - 1
    first_case = world.given[first][0]
    assert f"shrunk from {first_case!r}, which outlived timeout_s=600" in hung[0].failure
    assert f"smaller cases ran under timeout_s={SHRINK_TIMEOUT_MIN_S:g}" in hung[0].failure
    assert hung[0].examples_until_failure == first + 1 and hung[0].examples == len(world.given) - len(warmups)
    assert hung[0].describe("test-hang").count("Shrunk case that hung: Pair(a=5, b=0)") == 1


def test_shrinking_stops_after_the_most_steps_that_may_time_out(monkeypatch):
    import distcheck.certify.hangs as hangs

    assert MAX_SHRINK_HANGS == 32
    monkeypatch.setattr(hangs, "MAX_SHRINK_HANGS", 1)
    world = HangsWhenWide()
    cert = certify(add, TwoPropertyContract(), world=world, examples=200, seed=5, dtypes=["float64"])
    hung = [v for v in cert.verdicts if v.hung]
    assert sum(c.a >= 5 for c, _ in world.given) == 2  # the first hang and one more: then it stopped
    assert len(hung) == 1 and "shrinking stopped after 2 steps that timed out: a smaller case may hang too" \
        in hung[0].failure
    last = [c for c, _ in world.given if c.a >= 5][-1]
    assert hung[0].counterexample == repr(last)  # the smallest found so far, with its stacks
    assert all(f"a={last.a}, b={last.b})" in text for text in hung[0].stacks.values())


def test_a_hang_shrunk_past_hypothesis_time_limit_says_a_smaller_case_may_hang(monkeypatch):
    import distcheck.certify.hangs as hangs

    world = HangsWhenWide()
    plain = certify(add, TwoPropertyContract(), world=world, examples=200, seed=5, dtypes=["float64"])
    assert "may hang too" not in plain.verdicts[0].failure  # shrunk to the end well within the limit
    monkeypatch.setattr(hangs, "hypothesis_shrink_limit_s", lambda: 0.0)  # as if it had been reached
    late = certify(add, TwoPropertyContract(), world=HangsWhenWide(), examples=200, seed=5, dtypes=["float64"])
    assert late.verdicts[0].hung and late.verdicts[0].failure.endswith(
        "(Hypothesis stops shrinking one failure after 0 s, reached here: a smaller case may hang too)")


def test_a_hang_while_shrinking_a_failure_keeps_that_failure_and_the_hang_fails_the_next_property():
    class FailsThenHangs(HangsOnSeven):  # the first 16 fails sum; every later step hangs
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
    assert world.failed and world.timeouts > 1
    by = {v.property: v for v in cert.verdicts}
    # sum failed on its own; the hangs met while shrinking it are named, never hidden
    assert by["sum"].verdict == "FAIL" and not by["sum"].hung and by["sum"].failure.startswith("f(")
    assert "(while shrinking, another failure on Pair(" in by["sum"].failure and "timed out" in by["sum"].failure
    # the property left runs again from the start, hangs, and that hang is shrunk: the smallest case
    assert by["symmetric"].verdict == "FAIL" and by["symmetric"].hung
    assert by["symmetric"].counterexample == "Pair(a=0, b=0)"


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
    """A borrowed pool that counts the steps that timed out; ``step_s``: a step's timeout when the caller gives
    none (default the pool's), but for the first step of a world restarted after a timeout (the pool's own)."""

    def __init__(self, pool, step_s=None):
        self.pool, self.timeouts, self.step_s = pool, 0, step_s
        self.world_size, self.backend = pool.world_size, pool.backend
        self.restarted = False

    def run(self, fn, *args, timeout_s=None):
        if timeout_s is None and not self.restarted:
            timeout_s = self.step_s
        self.restarted = False
        try:
            return self.pool.run(fn, *args, timeout_s=timeout_s)
        except WorldTimeout:
            self.timeouts += 1
            self.restarted = True
            raise


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["gloo", "threaded"])
def test_a_hanging_layer_fails_once_and_the_pool_is_reaped(backend):
    pytest.importorskip("torch")
    from distcheck.runners.pool import RankPool

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with RankPool(2, backend=backend, timeout_s=3) as pool:
        pids = pool.pids
        counting = _Counting(pool)
        cert = certify(HANGING, "row-parallel-linear", world=counting, examples=5, seed=1,
                       dtypes=["float64", "float32"])
        assert counting.timeouts >= 1
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
@pytest.mark.slow
def test_a_layer_that_hangs_on_some_cases_is_reported_with_the_smallest_case_that_hangs():
    pytest.importorskip("torch")
    from distcheck.runners.pool import RankPool

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    # the layer's module imported before each fork and the world warmed with a layer that answers (under the
    # pool's own timeout, as is each new world's first step: the engine's warm-up), then steps of 3 s: a step
    # that outlives them is one that hangs, not a new world's first step initialising what the later ones reuse
    with RankPool(2, backend="gloo", timeout_s=60, preload=("examples.hanging_layers",)) as pool:
        assert certify("examples.my_tp_layers:RowParallelLinear", "row-parallel-linear", world=pool, examples=1,
                       seed=0, dtypes=["float64"]).ok
        counting = _Counting(pool, step_s=3.0)
        # seed 2 under dev: the first case that hangs has 6 input features (Hypothesis' generation, pinned by its
        # version), so the case reported is the first that hung only if nothing shrank it
        cert = certify(HANGING_WHEN_WIDE, "row-parallel-linear", world=counting, examples=20, seed=2, profile="dev",
                       dtypes=["float64"])
    (hung,) = [v for v in cert.verdicts if v.hung]
    # 4 input features (the fewest that hang; tp = 2 divides them), one row, every value 0
    assert hung.counterexample == ("TPCase(tp=2, x=[[0.0, 0.0, 0.0, 0.0]], weight=[[0.0, 0.0, 0.0, 0.0], "
                                   "[0.0, 0.0, 0.0, 0.0]], grad_output=[[0.0, 0.0]])"), hung.counterexample
    assert "shrunk from TPCase(tp=2, x=[[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]" in hung.failure
    assert sorted(hung.stacks) == [0, 1] and all(_sleep_line(1) in s for s in hung.stacks.values())
    assert hung.examples_until_failure > 1  # cases that do not hang passed before
    assert counting.timeouts > 1  # the hang was shrunk


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
