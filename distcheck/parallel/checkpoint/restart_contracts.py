"""The ``checkpoint-restart`` contract: a user's whole training state, as a torch DCP ``Stateful``, restarts
a run on another world as if it had never stopped.

Target: a factory ``make(parts) -> Stateful`` (a class taking the parts qualifies), ``parts`` a
:class:`~distcheck.parallel.checkpoint.stateful.TrainingParts` (``model``, ``optimizer``, ``lr_scheduler``,
``dataloader``, ``step``; the RNG is torch's default generator), the ``Stateful`` an object with
``state_dict()`` and ``load_state_dict(state)``, saved as ``dcp.save({"train": make(parts)})`` and loaded
with ``dcp.load``, which call them (torchtitan's ``CheckpointManager`` holds its states the same way).
``distcheck.parallel.checkpoint.plans:TRAINING_STATE`` is the whole state done right.

Each example trains ``steps`` (n, 2 to 4) steps of :mod:`distcheck.parallel.checkpoint.stateful`'s run (a
Linear of 1 to 3 inputs and 1 to 7 outputs under FSDP2, Adam, a warmup ``LambdaLR``, a stateful loader of 1
to 8 rows a batch, dropout p = 1/2 on the batch's inputs under option ``dropout``, default true) on N ranks,
saves after ``save_at`` (k, 1 to n - 1) steps and goes on to n; a new world of M ranks (M drawn as the
``checkpoint`` contract draws its loading world, :func:`~distcheck.parallel.checkpoint.contracts.load_worlds`,
under option ``reshard``) builds a fresh training, seeded as the first (what a restarted job does), loads,
and trains until its step counter reaches n. The loss is linear in the weight, so the gradients are exact
sums whatever the world (module doc of ``stateful``): the restarted run equals the uninterrupted one bit for
bit when the state is whole.

Properties:

* ``resume`` (bitwise): right after the load, the state the next steps read is what was saved: the weight,
  Adam's moments and step count, the learning rate and the scheduler's epoch, the loader's position, the step
  counter and, with dropout, the default generator's state (without dropout no step reads it).
* ``restart`` (bitwise): after n - k more steps, the weight, moments, step counts, learning rate, scheduler
  epoch, loader position and step counter are those of n uninterrupted steps (Kingma and Ba 2015,
  Algorithm 1: equal state and gradients give equal bits).

A scheduler not restored fails both (its epoch restarts, and from the second step after the load so does
the LR); an RNG not restored fails both with dropout and certifies without it (no step draws from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st

from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, resolve
from distcheck.engine.world import RankContext

__all__ = ["RestartCase", "RestartContract", "restart_cases"]


@dataclass(frozen=True)
class RestartCase:
    """One example (module doc): ``world_size`` ranks train ``steps`` steps and save after ``save_at``;
    ``load_world_size`` ranks (None: the same) load and finish. ``weight`` is the initial ``(d_out, d_in)``
    weight (float64 multiples of 1/8); ``rows`` the batch; ``seed`` the data's and the generator's."""

    world_size: int
    dtype: str
    d_in: int
    d_out: int
    rows: int
    steps: int
    save_at: int
    seed: int
    dropout: bool
    weight: tuple
    load_world_size: int | None = None

    @property
    def load_world(self) -> int:
        return self.world_size if self.load_world_size is None else self.load_world_size

    def __repr__(self) -> str:
        return (f"RestartCase({self.world_size} -> {self.load_world} ranks, {self.dtype}, Linear({self.d_in}, "
                f"{self.d_out}), {self.rows} rows a batch, save after {self.save_at} of {self.steps} steps, "
                f"seed={self.seed}, dropout={'on' if self.dropout else 'off'})")


def restart_cases(world_size: int, dtype: str, dropout: bool, load_world_sizes: tuple[int, ...] = ()
                  ) -> st.SearchStrategy[RestartCase]:
    """Cases saved at ``world_size`` ranks and loaded at one of ``(world_size, *load_world_sizes)`` (shrinking
    towards the first)."""
    loads = (world_size, *load_world_sizes)

    @st.composite
    def draw(draw: st.DrawFn) -> RestartCase:
        d_in, d_out, rows = draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 8))
        steps = draw(st.integers(2, 4))
        save_at = draw(st.integers(1, steps - 1))
        seed = draw(st.integers(0, 15))
        weight = tuple(tuple(((i * d_in + j) * (2 * seed + 1) % 17 - 8) / 8 for j in range(d_in))
                       for i in range(d_out))
        at = draw(st.sampled_from(loads))
        return RestartCase(world_size, dtype, d_in, d_out, rows, steps, save_at, seed, dropout, weight,
                           None if at == world_size else at)

    return draw()


_PROPERTIES = (
    PropertySpec("resume", "after the load, the weight, Adam's moments and step, the LR and scheduler epoch, the "
                           "loader position, the step counter and (with dropout) the RNG state are what was saved",
                 "bitwise"),
    PropertySpec("restart", "k steps, a save, a load on a new world and n - k more steps give the state of n "
                            "uninterrupted steps", "bitwise"),
)


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _diff(want: dict, got: dict) -> list[str]:
    bad = []
    for key, v in want.items():
        if key not in got:
            bad.append(f"{key}: missing")
        elif not _same(v, got[key]):
            w, g = np.asarray(v), np.asarray(got[key])
            if w.size <= 1 and g.size <= 1:
                bad.append(f"{key}: expected {w.tolist()}, got {g.tolist()}")
            elif key == "rng":
                bad.append("rng: the generator's state differs from the saved one")
            else:
                at = int(np.flatnonzero(w.ravel() != g.ravel())[0]) if w.shape == g.shape else 0
                bad.append(f"{key}{list(w.shape)}: from flat index {at} expected {w.ravel()[at:at + 4].tolist()}, "
                           f"got {g.ravel()[at:at + 4].tolist()}")
    return bad


def _save_side(ctx: RankContext, target: Target, case: RestartCase, path: str) -> dict:
    from distcheck.parallel.checkpoint.stateful import save_side

    return save_side(ctx, resolve(target), target.ref, case, path)


def _load_side(ctx: RankContext, target: Target, case: RestartCase, path: str) -> dict:
    from distcheck.parallel.checkpoint.stateful import load_side

    return load_side(ctx, resolve(target), target.ref, case, path)


class RestartContract(Contract):
    """A whole training state restarts a run on another world bitwise (module doc)."""

    name = "checkpoint-restart"
    parallelism = "checkpoint"
    min_world_size = 2
    min_world_reason = ("one rank holds the whole state unsharded and the world cannot change size under it: the "
                        "part of a restart that depends on the world (resharding the state, each rank's rows of the "
                        "batch) is not exercised")
    summary = ("a Stateful training state: k steps, save, load on another world, n - k steps equal n uninterrupted "
               "steps bitwise")
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    options: ClassVar[tuple[Option, ...]] = (
        Option("dropout", True, bool, "dropout p = 1/2 on each batch's inputs, its masks drawn from torch's default "
                                      "generator: the RNG state is then part of the state a restart needs"),
        Option("reshard", True, bool, "load on another world too, as the checkpoint contract does (N - 1 ranks "
                                      "from 3, 2N up to 4); false: save and load on the certified world alone"),
    )
    dtypes = ("float64", "float32")
    preload = ("torch.distributed.fsdp", "torch.distributed.checkpoint")

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        if not callable(obj):
            raise ProtocolError("target", ref or repr(obj), "must be a callable make(parts) returning a Stateful "
                                                            "(state_dict() and load_state_dict(state))")
        return make_target(obj, ref, "stateful"), options

    def companion_worlds(self, world_size: int, options: dict) -> tuple[int, ...]:
        from distcheck.parallel.checkpoint.contracts import load_worlds

        if not options.get("reshard", True) or self.cannot_fail(world_size, options) is not None:
            return ()
        return load_worlds(world_size)

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[RestartCase]:
        return restart_cases(world_size, dtype, bool(options.get("dropout", True)),
                             self.companion_worlds(world_size, options))

    def composition(self, case: RestartCase) -> dict[str, str]:
        return {"worlds": f"{case.world_size} -> {case.load_world}"}

    def run_rank(self, ctx: RankContext, target: Target, case: RestartCase, dtype: str, options: dict) -> dict:
        """Both sides on one world (``reshard=false``), through a folder rank 0 makes and removes."""
        import shutil

        import torch.distributed as dist

        from distcheck.parallel.checkpoint.harness import shared_folder

        path = shared_folder(ctx)
        try:
            saved = _save_side(ctx, target, case, path)
            out = {"saved": saved["saved"], "want": saved["final"], **_load_side(ctx, target, case, path)}
        finally:
            dist.barrier(group=ctx.group)
            if ctx.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
        return out

    def run_case(self, world_of: Any, target: Target, case: RestartCase, dtype: str, options: dict,
                 timeout_s: float | None = None) -> list:
        """The saving world's steps then the loading world's, on a folder made here and removed after, each
        world step under ``timeout_s``; the results are the loading ranks', each with the saving world's
        ``saved`` and its uninterrupted ``final`` as ``want``."""
        import shutil
        import tempfile

        timeout = {} if timeout_s is None else {"timeout_s": timeout_s}
        path = tempfile.mkdtemp(prefix="distcheck-restart-")
        try:
            saved = world_of(case.world_size).run(_save_side, target, case, path, **timeout)
            loaded = world_of(case.load_world).run(_load_side, target, case, path, **timeout)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return [{"saved": saved[0]["saved"], "want": saved[0]["final"], **got} for got in loaded]

    def check(self, case: RestartCase, results: list, world_size: int, dtype: str, options: dict
              ) -> dict[str, Outcome]:
        where = (f"saved at {case.world_size} ranks after {case.save_at} steps, "
                 + (f"loaded at {case.load_world} (ranks of the loading world): " if case.load_world != case.world_size
                    else "loaded there: "))

        def verdict(bad: list[tuple[int, str]]) -> Outcome:
            if not bad:
                return Outcome(True, max_error=0.0, bound=0.0)
            return Outcome(False, bound=0.0, ranks=tuple(sorted({r for r, _ in bad})),
                           message=where + "; ".join(f"rank {r}: {m}" for r, m in bad[:4]))

        resume = [(r, m) for r, res in enumerate(results) for m in _diff(res["saved"], res["loaded"])]
        restart = [(r, f"after {case.steps} steps, {m}") for r, res in enumerate(results)
                   for m in _diff({k: v for k, v in res["want"].items() if k != "rng"}, res["final"])]
        return {"resume": verdict(resume), "restart": verdict(restart)}
