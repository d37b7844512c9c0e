"""Shared test hooks: ``gpu`` tests are skipped in the parent, before anything is spawned, when CUDA is absent."""

from __future__ import annotations

import pytest


def _gpu_unavailable_reason() -> str | None:
    """Why NCCL tests cannot run here, or None when CUDA and NCCL are both present."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return f"torch is not installed: {exc}"
    if not torch.cuda.is_available():
        return "CUDA is not available (gpu tests need a CUDA build of torch and a visible GPU)"
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch build has no NCCL backend"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # no torch import when no gpu test was collected
    reason = _gpu_unavailable_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def torchrun_check():
    """Run ``torchrun --standalone --nproc-per-node=N -m distcheck check --launcher torchrun ARGS...``.

    Returns ``launch(nproc, *args, timeout_s=220) -> (stdout, stderr)``; fails the
    test when torchrun exits non-zero or runs past ``timeout_s``, killing torchrun
    and its workers together (they run in a session of their own).
    """
    import os
    import shutil
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def launch(nproc: int, *args: str, timeout_s: float = 220) -> tuple[str, str]:
        launcher = shutil.which("torchrun")
        cmd = ([launcher] if launcher else [sys.executable, "-m", "torch.distributed.run"]) + [
            "--standalone", f"--nproc-per-node={nproc}", "-m", "distcheck", "check", "--launcher", "torchrun", *args]
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"torchrun did not finish in {timeout_s} s:\n{out[-2000:]}{err[-4000:]}")
        if proc.returncode != 0:
            pytest.fail(f"torchrun exited with {proc.returncode}:\n{out[-3000:]}{err[-3000:]}")
        return out, err

    return launch


# ---------------------------------------------------------------- rank pools shared by a test module
# Module-scoped: each test module that asks for one starts its own world and closes it after its last test
# (a module needing different settings, a preload say, defines its own fixture of the same name).


def _pool(world_size: int, backend: str):
    pytest.importorskip("torch")
    from distcheck.runners import RankPool

    return RankPool(world_size=world_size, backend=backend, timeout_s=90)


@pytest.fixture(scope="module")
def gloo2():
    with _pool(2, "gloo") as pool:
        yield pool


@pytest.fixture(scope="module")
def threaded2():
    with _pool(2, "threaded") as pool:
        yield pool


@pytest.fixture(scope="module")
def threaded4():
    with _pool(4, "threaded") as pool:
        yield pool


# ---------------------------------------------------------------- the built distribution, shared by the session


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory):
    """``python -m build``: the sdist, then the wheel built from that sdist (as a release is), once per session.

    Returns the folder holding both; tests/test_packaging.py reads them and tests/test_acceptance.py installs
    the wheel, so the suite builds the package once rather than once per module.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    from filelock import FileLock

    root = Path(__file__).resolve().parent.parent
    # under pytest-xdist every worker has its own base temp folder below one shared parent: the first
    # worker to ask builds there, under a lock, and the others find the result (pytest-xdist's own recipe)
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    out = (shared / "dist") if shared is not None else tmp_path_factory.mktemp("dist")
    with FileLock(str(out) + ".lock"):
        done = out.parent / (out.name + ".built")  # beside the folder: tests list what is inside it
        if not done.exists():
            out.mkdir(exist_ok=True)
            proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(root)],
                                  capture_output=True, text=True, timeout=600, check=False)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            done.write_text("")
    return out
