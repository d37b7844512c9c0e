"""The planner's closed forms without sympy: each exact evaluator equals the catalogue's form, and
``distcheck plan memory`` answers without importing sympy (no timing here: benchmarks/bench_plan.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck.closed_form import get
from distcheck.plan.estimate import EXACT_FORMS

ROOT = Path(__file__).resolve().parents[2]


def _inputs(name: str):
    """Drawn values for every input of form ``name``, in its domain (sizes up to 4096)."""
    out = {}
    for i in get(name).inputs:
        if i.kind == "flag":
            out[i.name] = st.sampled_from([0, 1])
        elif i.kind == "nonnegative_integer":
            out[i.name] = st.integers(0, 4096)
        else:
            out[i.name] = st.integers(1, 4096)
    return st.fixed_dictionaries(out)


@pytest.mark.parametrize("name", sorted(EXACT_FORMS))
def test_each_exact_evaluator_equals_the_catalogue_form(name):
    @settings(max_examples=40, deadline=None)
    @given(_inputs(name))
    def check(values):
        want = get(name).evaluate(**values)
        got = EXACT_FORMS[name](**values)
        assert got == want, (values, got, want)

    check()


def test_plan_memory_does_not_import_sympy():
    code = ("import sys; from distcheck.cli import main; "
            "code = main(['plan', 'memory', '--model', 'llama-3-70b', '--gpus', '64', '--quiet']); "
            "print(code, sorted(m for m in ('sympy', 'torch', 'hypothesis') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []"


def test_plan_time_does_not_import_sympy():
    code = ("import sys; from distcheck.cli import main; "
            "code = main(['plan', 'time', '--model', 'llama-3-70b', '--gpus', '64', '--quiet', '--top', '1']); "
            "print(code, sorted(m for m in ('sympy', 'torch', 'hypothesis', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []"
