"""The rank side of the ``checkpoint-restart`` contract: a whole training state (model, optimizer, LR
scheduler, RNG, data-loader position, step counter) trained k steps, saved through the user's ``Stateful``,
loaded on another world, trained to step n.

Each rank builds :class:`TrainingParts` (as torchtitan's ``CheckpointManager`` holds them):

* ``model``: one ``Linear(d_in, d_out, bias=False)`` in the case's dtype, FSDP2's ``fully_shard`` over the
  world (dim-0 shards of the weight, uneven for most ``d_out``; FSDP2 averages the gradients over the ranks);
* ``optimizer``: Adam (lr :data:`LR`); ``lr_scheduler``: ``LambdaLR`` with :func:`warmup` (the LR rises over
  4 steps: a schedule that reads its epoch, so a scheduler not restored restarts its warmup; ``StepLR``'s
  chained form would hide it, the restored optimizer carrying the LR);
* ``dataloader``: :class:`BatchLoader`, whose position (batches consumed) is its state, as torchdata's
  ``StatefulDataLoader``'s is; batch p is a function of the case's seed and p alone;
* ``step``: the steps taken; the RNG is torch's default CPU generator, seeded alike on every rank
  (``torch.manual_seed(case.seed)``, what a job does at start).

One step: the loader's next global batch ``(x, t)`` (``rows`` rows, multiples of 1/4 in [-1, 1]); with
dropout, ``x`` through ``F.dropout(p=1/2)`` whole, so that every rank draws the same mask from the same
generator state and a sample's mask does not depend on the world size; rank r's rows ``r::N``; the loss
``N * sum(model(x_r) * t_r)`` (times N: FSDP2's mean over the N ranks is then the batch's sum; torch 2.13
refuses ``set_gradient_divide_factor(1.0)`` on gloo in float32, its ``PREMUL_SUM``); backward,
``optimizer.step()``, ``lr_scheduler.step()``, ``zero_grad()``, ``step += 1``. The loss is linear in the
weight, so every gradient is ``sum_i t_i x_i^T`` over the batch: products of multiples of 1/4 (times 2
under dropout) summed over at most 8 rows, a dozen significant bits with the factor N and its division:
exact in float32 and float64 whatever the world size and the order of the reduction. Adam is elementwise:
equal state gives equal bits. That is what makes restart equivalence across world sizes bitwise.

The user's target is a factory ``make(parts) -> Stateful`` (an object with ``state_dict()`` and
``load_state_dict(state)``, torch DCP's ``Stateful`` protocol); the harness saves ``{"train":
make(parts)}`` with ``dcp.save`` and loads it with ``dcp.load``, which calls those two methods.
:class:`TrainingState` is the whole state done right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from distcheck.engine.world import RankContext

__all__ = ["LR", "warmup", "BatchLoader", "TrainingParts", "TrainingState", "build_parts", "train_step", "view",
           "save_side", "load_side", "check_stateful"]

#: Adam's base learning rate
LR = 2.0**-4


def warmup(epoch: int) -> float:
    """The LR factor of ``LambdaLR`` at ``epoch``: ``min(epoch + 1, 4) / 4`` (1/4, 1/2, 3/4, then 1)."""
    return min(epoch + 1, 4) / 4


class BatchLoader:
    """A data loader whose state is its position: batch ``p`` holds ``rows`` samples of ``d_in`` inputs and
    ``d_out`` targets, multiples of 1/4 in [-1, 1] drawn from ``numpy.random.default_rng((seed, p))``."""

    def __init__(self, seed: int, rows: int, d_in: int, d_out: int) -> None:
        self.seed, self.rows, self.d_in, self.d_out = seed, rows, d_in, d_out
        self.position = 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The batch at the position, then the position advanced."""
        g = np.random.default_rng((self.seed, self.position))
        self.position += 1
        return (g.integers(-4, 5, (self.rows, self.d_in)) / 4, g.integers(-4, 5, (self.rows, self.d_out)) / 4)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


@dataclass
class TrainingParts:
    """What a training loop holds (module doc): ``model``, ``optimizer``, ``lr_scheduler``, ``dataloader``
    and ``step``; the RNG is torch's default generator."""

    model: Any
    optimizer: Any
    lr_scheduler: Any
    dataloader: BatchLoader
    step: int = 0


class TrainingState:
    """The whole training state as one DCP ``Stateful`` (torchtitan's ``CheckpointManager`` states in one):
    the model and optimizer through ``get_state_dict`` / ``set_state_dict`` (FQN keys, DTensor shards),
    the scheduler's and the loader's ``state_dict``, ``torch.get_rng_state()`` and the step counter."""

    def __init__(self, parts: TrainingParts) -> None:
        self.parts = parts

    def state_dict(self) -> dict:
        import torch
        from torch.distributed.checkpoint.state_dict import get_state_dict

        p = self.parts
        msd, osd = get_state_dict(p.model, p.optimizer)
        return {"model": msd, "optim": osd, "lr_scheduler": p.lr_scheduler.state_dict(),
                "dataloader": p.dataloader.state_dict(), "rng": torch.get_rng_state(), "step": p.step}

    def load_state_dict(self, state: dict) -> None:
        import torch
        from torch.distributed.checkpoint.state_dict import set_state_dict

        p = self.parts
        set_state_dict(p.model, p.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        p.lr_scheduler.load_state_dict(state["lr_scheduler"])
        p.dataloader.load_state_dict(state["dataloader"])
        torch.set_rng_state(state["rng"])
        p.step = int(state["step"])


def build_parts(ctx: RankContext, case: Any) -> TrainingParts:
    """A fresh training of ``case`` on this rank (module doc): the weight at its initial value, step 0, the
    loader at position 0, the default generator seeded with ``case.seed``."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    model = torch.nn.Linear(case.d_in, case.d_out, bias=False)
    with torch.no_grad():
        model.weight = torch.nn.Parameter(torch.tensor(case.weight, dtype=dtype))
    model.to(ctx.device)
    fully_shard(model, mesh=init_device_mesh(ctx.device.type, (ctx.world_size,)))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    return TrainingParts(model, optimizer, scheduler, BatchLoader(case.seed, case.rows, case.d_in, case.d_out))


def train_step(ctx: RankContext, parts: TrainingParts, case: Any) -> None:
    """One step of the module doc on this rank."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, case.dtype)
    x, t = (torch.tensor(a, dtype=dtype, device=ctx.device) for a in parts.dataloader.next_batch())
    if case.dropout:
        x = F.dropout(x, p=0.5, training=True)
    mine = slice(ctx.rank, None, ctx.world_size)
    (ctx.world_size * (parts.model(x[mine]) * t[mine]).sum()).backward()
    parts.optimizer.step()
    parts.lr_scheduler.step()
    parts.optimizer.zero_grad()
    parts.step += 1


def view(parts: TrainingParts, rng: bool) -> dict:
    """The state a run's next steps read, whole: the weight, Adam's moments and step count (``weight``,
    ``weight.exp_avg``, ...), ``lr``, ``lr_scheduler.last_epoch``, ``dataloader.position``, ``step`` and, with
    ``rng``, the default generator's state (``rng``: its bytes)."""
    import torch

    from distcheck.parallel.checkpoint.harness import snapshot

    out = snapshot(parts.model, parts.optimizer)
    out["lr"] = float(parts.optimizer.param_groups[0]["lr"])
    out["lr_scheduler.last_epoch"] = int(parts.lr_scheduler.last_epoch)
    out["dataloader.position"] = int(parts.dataloader.position)
    out["step"] = int(parts.step)
    if rng:
        out["rng"] = torch.get_rng_state().numpy().copy()
    return out


def check_stateful(obj: Any, ref: str) -> Any:
    """``obj`` when it has callable ``state_dict`` and ``load_state_dict``; else ProtocolError."""
    from distcheck.engine.contracts.errors import ProtocolError

    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise ProtocolError("target", ref, f"make(parts) must return a Stateful (state_dict() and "
                                           f"load_state_dict(state)), got {type(obj).__name__}")
    return obj


def save_side(ctx: RankContext, make: Any, ref: str, case: Any, path: str) -> dict:
    """The saving world: ``save_at`` steps, ``dcp.save({"train": make(parts)})`` into ``path``, then on to step
    ``steps`` uninterrupted. Returns ``saved`` (:func:`view` at the save) and ``final`` (after ``steps``)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    parts = build_parts(ctx, case)
    for _ in range(case.save_at):
        train_step(ctx, parts, case)
    saved = view(parts, case.dropout)
    dcp.save({"train": check_stateful(make(parts), ref)}, checkpoint_id=path)
    dist.barrier(group=ctx.group)
    for _ in range(case.steps - case.save_at):
        train_step(ctx, parts, case)
    return {"saved": saved, "final": view(parts, case.dropout)}


def load_side(ctx: RankContext, make: Any, ref: str, case: Any, path: str) -> dict:
    """The loading world: a fresh training (:func:`build_parts`), ``dcp.load({"train": make(parts)})`` from
    ``path``, then steps until the step counter reaches ``steps`` (at most ``steps`` of them: a counter loaded
    wrong neither loops for ever nor stops at once unnoticed). Returns ``loaded`` (:func:`view` after the load)
    and ``final``."""
    import torch.distributed.checkpoint as dcp

    parts = build_parts(ctx, case)
    dcp.load({"train": check_stateful(make(parts), ref)}, checkpoint_id=path)
    loaded = view(parts, case.dropout)
    for _ in range(min(case.steps, max(0, case.steps - int(parts.step)))):
        train_step(ctx, parts, case)
    return {"loaded": loaded, "final": view(parts, case.dropout)}
