"""The "certify your own implementation" snippet (docs/PYTHON_API.md), run the way a new user runs it:
in their own folder (no distcheck conftest, so no distcheck Hypothesis profile), under
Hypothesis' default settings (200 ms deadline), with a correct and a wrong layer.

Before distcheck.props loaded the closed-form catalogue at import, the first example
imported sympy lazily (0.6-1 s) and the run failed with DeadlineExceeded/FlakyFailure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

USER_TEST = textwrap.dedent(
    """
    import numpy as np
    from hypothesis import given
    from distcheck import strategies as ds
    from distcheck.props import get, with_edge_cases


    def my_row_parallel(x, W, tp, b=None, *, log=None):
        parts = [xs @ Ws for xs, Ws in zip(np.array_split(x, tp, axis=-1), np.array_split(W, tp, axis=0))]
        out = sum(parts[1:], parts[0])        # the all-reduce
        if log is not None:
            log.append(("all_reduce", out.shape))
        return out if b is None else out + b


    def wrong_row_parallel(x, W, tp, b=None, *, log=None):  # adds the bias on every rank
        out = my_row_parallel(x, W, tp, log=log)
        return out if b is None else out + tp * b


    @with_edge_cases("tp.row.exact")
    @given(ds.linear_cases(max_tp=8))
    def test_my_row_parallel_layer(case):
        get("tp.row.exact").check(case, impl=my_row_parallel)


    @given(ds.linear_cases(max_tp=8))
    def test_wrong_row_parallel_layer(case):
        get("tp.row.exact").check(case, impl=wrong_row_parallel)


    @with_edge_cases("tp.row.exact")
    @given(ds.linear_cases(max_tp=8))
    def test_wrong_row_parallel_layer_on_the_edge_cases(case):
        get("tp.row.exact").check(case, impl=wrong_row_parallel)
    """
)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS", "CI")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_readme_snippet_passes_under_default_hypothesis_settings(tmp_path):
    (tmp_path / "test_mine.py").write_text(USER_TEST)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert "2 failed, 1 passed" in out, out[-4000:]
    assert "DeadlineExceeded" not in out and "Flaky" not in out, out[-4000:]
    # the wrong layer fails with a readable, shrunk counterexample and the numbers
    assert "FAILED test_mine.py::test_wrong_row_parallel_layer" in out
    # Hypothesis' heading changed across versions: "Falsifying example" / "Failing test case"
    assert ("Falsifying example" in out or "Failing test case" in out) and "case=LinearCase(" in out
    assert "not bitwise equal" in out and "expected array(" in out and "got array(" in out
    # with the property's edge cases, the first one (tp = 2, three input features, a bias) fails first
    assert "FAILED test_mine.py::test_wrong_row_parallel_layer_on_the_edge_cases" in out
    assert "explicit example" in out and "case=LinearCase(x=array([[1., 2., 3.]])" in out


FIRST_CALLS = textwrap.dedent(
    """
    import sys, time, warnings
    import distcheck.props as props

    for prop in props.properties():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .example() outside @given is fine here: one case per property
            case = prop.strategy().example()
        before = set(sys.modules)
        start = time.perf_counter()
        prop.check(case)
        took = time.perf_counter() - start
        late = sorted(m for m in set(sys.modules) - before
                      if m.split(".")[0] == "sympy" or m.endswith(".forms"))
        print(prop.name, f"{took:.4f}", ",".join(late) or "-")
    """
)


def test_the_first_example_of_every_property_imports_no_sympy():
    # the import that used to happen inside the first example (and blew the 200 ms deadline)
    proc = subprocess.run([sys.executable, "-c", FIRST_CALLS], env=_env(), capture_output=True, text=True, timeout=240)
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and len(rows) >= 20, proc.stderr[-3000:]
    late = [(name, mods) for name, _, mods in rows if mods != "-"]
    assert late == [], late
