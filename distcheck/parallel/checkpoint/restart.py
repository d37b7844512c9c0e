"""Restart equivalence: a training run under torchrun whose rank is SIGKILLed at step k, restarted by
torchrun (``--max-restarts``) from its last checkpoint, ends with the parameters of the run never killed.

Run on every rank by torchrun::

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 -m distcheck.parallel.checkpoint.restart OUT \\
        --steps 4 --kill-at 2

Each rank trains a small MLP (``Linear(4, 8)``, ReLU, ``Linear(8, 2)``, float64) under FSDP2's
``fully_shard`` with Adam (lr 2**-6), step s on its rows of a batch drawn from seed s (sum loss). After step
s it saves ``{"model", "optim", "step"}`` with ``dcp.save`` into the new folder ``OUT/step-<s>`` and rank 0
then points ``OUT/LATEST`` at it (:func:`distcheck.core.atomic.write_text_atomic`, a rename): a folder per
save, so a kill leaves the previous checkpoint whole (:mod:`distcheck.parallel.checkpoint.dcp_atomic`).
At start a rank loads the checkpoint ``LATEST`` names, if any, and resumes after its step. With
``--kill-at k`` rank 1 of the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) SIGKILLs itself before
saving step k. Rank 0 writes ``OUT/final.npz`` (every parameter whole) and appends the attempt's restart
count to ``OUT/attempts``. Each attempt meets in a ``FileStore`` of its own (``OUT/.store-<attempt>``, one
node): with torchrun's store, the restarted ranks of torch 2.13 read the killed attempt's gloo addresses
here and time out connecting ("Connection refused"). The same world size and the same reductions in the
same order give the same bits: the restarted run must equal the uninterrupted one bit for bit
(``tests/test_checkpoint.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "train"]


def _model(mesh: Any) -> tuple[Any, Any]:
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).double()
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=2.0**-6)


def _batch(step: int, rank: int, world_size: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(-3, 4, (4 * world_size, 4), generator=g).double()
    t = torch.randint(-3, 4, (4 * world_size, 2), generator=g).double()
    return x[rank::world_size], t[rank::world_size]


def train(out: Path, steps: int, kill_at: int) -> None:
    """The run of the module doc, on this rank of the torchrun world."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from distcheck.core.atomic import write_text_atomic
    from distcheck.parallel.checkpoint.harness import snapshot

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # a store per attempt: the restarted ranks must not read the killed attempt's gloo addresses
    dist.init_process_group("gloo", store=dist.FileStore(str(out / f".store-{attempt}"), world), rank=rank,
                            world_size=world)
    model, opt = _model(init_device_mesh("cpu", (world,)))
    start = 0
    pointer = out / "LATEST"
    if pointer.exists():
        msd, osd = get_state_dict(model, opt)
        state: Any = {"model": msd, "optim": osd, "step": 0}
        dcp.load(state, checkpoint_id=str(out / pointer.read_text()))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"]) + 1
    if rank == 0:
        with open(out / "attempts", "a") as f:
            f.write(f"{attempt} {start}\n")
    for step in range(start, steps):
        x, t = _batch(step, rank, world)
        (model(x) - t).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == kill_at and attempt == 0 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "step": step}, checkpoint_id=str(out / f"step-{step}"))
        dist.barrier()
        if rank == 0:
            write_text_atomic(out / "LATEST", f"step-{step}")
        dist.barrier()
    whole = snapshot(model, opt)
    if rank == 0:
        arrays: Any = {k.replace(".", "_"): np.asarray(v) for k, v in whole.items()}
        np.savez(out / "final.npz", **arrays)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """The command line of the module doc."""
    from distcheck.core.validate import check_positive_int

    parser = argparse.ArgumentParser(prog="python -m distcheck.parallel.checkpoint.restart")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=-1, help="step at which rank 1 is SIGKILLed (-1: never)")
    args = parser.parse_args(argv)
    check_positive_int("steps", args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    train(args.out, args.steps, args.kill_at)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
