"""``distcheck certify --launcher torchrun``: rank 0 drives Hypothesis, every rank runs each example.

Under torchrun every process runs the same command. Rank 0 (the leader) runs the engine exactly
as a parent would: it draws each example, then sends ``(fn, args)`` to the other ranks over a
gloo side group (broadcast), and every rank, rank 0 included, runs it through one
:class:`~distcheck.runners.torchrun_world.TorchrunWorld` (results and failures exchanged with
``all_gather_object``). The other ranks (followers) loop on those messages until rank 0 sends
the exit code. Only rank 0 draws, shrinks, prints and writes the certificate, so the ranks never
have to agree on Hypothesis' choices.

No parent watches the ranks: a stuck collective ends at the process group's timeout
(``--timeout``) or at torchrun's watchdog; the side group waits up to
:data:`~distcheck.runners.torchrun_world.FINAL_EXCHANGE_TIMEOUT_S` for rank 0's next message.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from distcheck.core.errors import DistributedError, RankFailure
from distcheck.engine.world import World

__all__ = ["LeaderWorld", "follow"]


class LeaderWorld:
    """Rank 0's view of a torchrun world: ``run`` sends the step to the followers, then takes part in it."""

    def __init__(self, world: World, side_group: Any):
        self.world = world
        self.side = side_group
        self.world_size = world.world_size
        self.backend = world.backend

    def run(self, fn: Callable, *args: Any, timeout_s: float | None = None) -> list:
        import torch.distributed as dist

        dist.broadcast_object_list([("run", fn, args)], src=0, group=self.side)
        return self.world.run(fn, *args)

    def stop(self, code: int) -> None:
        """Tell the followers to return ``code``."""
        import torch.distributed as dist

        dist.broadcast_object_list([("stop", code, ())], src=0, group=self.side)


def follow(world: World, side_group: Any) -> int:
    """A follower's loop: run every step rank 0 sends; return the exit code rank 0 sends at the end.

    A step that fails on some rank raises the same RankFailure on every rank; the follower
    carries on (rank 0 reports it). A broken exchange ends the loop with exit code 1.
    """
    import torch.distributed as dist

    while True:
        box: list = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=side_group)
        except Exception:  # noqa: BLE001 - rank 0 went away: torchrun stops the others too
            return 1
        kind, payload, args = box[0]
        if kind == "stop":
            return int(payload)
        try:
            world.run(payload, *args)
        except RankFailure:
            continue
        except DistributedError:
            return 1


def side_group(timeout_s: float) -> Any:
    """A gloo group over the whole world whose timeout covers rank 0's pauses between steps."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
