"""The certify issue's acceptance, end to end, as a user meets it:

1. A new user who follows the README certifies an example layer with one command and gets a
   certificate; a broken layer fails with a shrunk counterexample naming the rank, and exits 1.
   (The README's own command lines, read from it, run in a folder holding the examples.)
2. The pytest plugin works in a project that has only ``pip install distcheck`` (plus torch and
   pytest): the wheel is built, installed into a fresh virtual environment, and a plain ``pytest`` in a
   project outside the checkout certifies a layer on a live pool with the marker and the fixtures, one
   passing and one failing certification.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _readme_certify_commands() -> list[str]:
    """The ``distcheck certify`` lines of README's first block under "Certify your own layer"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Certify your own layer", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#", 1)[0].split()) for line in lines if line.startswith("distcheck certify")]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


@pytest.mark.timeout(600)
def test_readme_user_certifies_with_one_command_and_a_broken_layer_exits_1(tmp_path):
    good, broken = _readme_certify_commands()[:2]
    assert "--certificate row.json" in good and "RowParallelReduceToRank0" in broken
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # "from the repository root": examples/ importable
    ok = subprocess.run(good, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=500, env=_env(),
                        check=False)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "30 passed, 0 failed" in ok.stdout
    doc = json.loads((tmp_path / "row.json").read_text())
    assert doc["verdict"] == "certified" and doc["command"].startswith(good.split(" --certificate")[0])
    (cert,) = doc["certifications"]
    assert cert["target"] == "examples.my_tp_layers:RowParallelLinear" and cert["world_sizes"] == [2, 4]
    assert {v["verdict"] for v in cert["verdicts"]} == {"pass"} and len(cert["verdicts"]) == 30
    assert "examples.my_tp_layers:RowParallelLinear" in (tmp_path / "row.md").read_text()
    bad = subprocess.run(broken, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=500, env=_env(),
                        check=False)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    out = " ".join(bad.stdout.split())
    assert "rank 1 differs from the reference (rank 0 matches)" in out
    assert "Shrunk case: TPCase(tp=2, x=[[1.0, 1.0]]" in out
    assert "Reproduce: distcheck certify examples.my_tp_layers:RowParallelReduceToRank0" in out


LAYERS = '''
    """A user's row-parallel linear, correct and broken, with plain torch.distributed."""
    import torch
    import torch.distributed as dist
    from torch import nn


    class _Sum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g


    class _ToRank0(_Sum):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.reduce(x, dst=0)  # only rank 0 gets the sum
            return x


    class _Split(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, lo, hi):
            ctx.shape, ctx.lo, ctx.hi = x.shape, lo, hi
            return x[..., lo:hi].contiguous()

        @staticmethod
        def backward(ctx, g):
            parts = [torch.empty_like(g) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, g.contiguous())
            return torch.cat(parts, dim=-1), None, None


    class RowParallel(nn.Module):
        reduce = _Sum

        def __init__(self, in_features, out_features, bias=True):
            super().__init__()
            tp, rank = dist.get_world_size(), dist.get_rank()
            self.lo, self.hi = rank * in_features // tp, (rank + 1) * in_features // tp
            self.weight = nn.Parameter(torch.zeros(out_features, self.hi - self.lo))
            self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

        def forward(self, x):
            y = self.reduce.apply(_Split.apply(x, self.lo, self.hi) @ self.weight.t())
            return y if self.bias is None else y + self.bias


    class ReduceToRank0(RowParallel):
        reduce = _ToRank0
'''

TESTS = '''
    import sys

    import pytest

    from distcheck.certify import certify


    def test_nothing_heavy_is_imported_by_the_plugin():
        assert "torch" not in sys.modules


    @pytest.mark.world_size(2)
    def test_row_parallel_is_certified(rank_pool):
        cert = certify("layers:RowParallel", contract="row-parallel-linear", pool=rank_pool, examples=10, seed=3)
        cert.assert_certified()
        assert len(cert.verdicts) == 15 and rank_pool.world_size == 2 and rank_pool.backend == "gloo"


    @pytest.mark.world_size(2)
    def test_reduce_to_rank_0_is_not(distcheck_certify):
        distcheck_certify("layers:ReduceToRank0", "row-parallel-linear", dtypes=["float64"]).assert_certified()
'''


@pytest.mark.timeout(1500)
def test_plain_pytest_certifies_in_a_project_that_only_installed_the_wheel(tmp_path, built_dist):
    torch_pin = next(line.strip() for line in (ROOT / "requirements-ci.txt").read_text().splitlines()
                     if line.startswith("torch=="))
    (wheel,) = built_dist.glob("distcheck-*.whl")  # the session's one build (conftest.py), as test_packaging reads it
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", torch_pin, str(wheel), "pytest"],
                         capture_output=True, text=True, timeout=900, check=False)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    project = tmp_path / "project"  # outside the checkout: only the installed wheel can be imported
    project.mkdir()
    (project / "layers.py").write_text(textwrap.dedent(LAYERS))
    (project / "test_layers.py").write_text(textwrap.dedent(TESTS))
    env = _env()
    env["PATH"] = str(venv / "bin") + os.pathsep + env["PATH"]
    run = subprocess.run([str(venv / "bin" / "pytest"), "--distcheck-seed=5", "--distcheck-examples=10"],
                         cwd=project, capture_output=True, text=True, timeout=600, env=env, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert re.search(r"1 failed, 2 passed", out), out[-4000:]
    flat = " ".join(out.split())
    assert "CertificationFailed: layers:ReduceToRank0 is not certified under row-parallel-linear" in flat
    assert "rank 1 differs from the reference (rank 0 matches)" in flat and "Shrunk case: TPCase(tp=2" in flat
    assert "Reproduce: distcheck certify layers:ReduceToRank0 --contract row-parallel-linear --world-sizes 2" in flat
    where = subprocess.run([str(py), "-c", "import distcheck; print(distcheck.__file__)"], cwd=project,
                           capture_output=True, text=True, timeout=60, env=env, check=False).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout's
