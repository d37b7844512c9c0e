"""The messages between a pool's parent and its children, and how a child runs one task.

Every message is one ``pickle`` on a duplex pipe (``Connection.send_bytes``).

Parent to child:

* a task ``(seq, fn, args_list, timeout_s)``: call ``fn(ctx, *args)`` for each rank the
  child serves (``args_list[i]`` for its i-th rank: one rank for a process rank, every
  rank for the threaded host); ``seq`` numbers the steps;
* :data:`SHUTDOWN` (empty bytes): exit.

Child to parent:

* at start-up, ``("ready", None)`` once every rank of the child joined the world, or
  ``("fail", [(rank, "err", traceback, None), ...])`` when its set-up failed, or (the
  threaded host only) ``("startup_timeout", [(rank, "timeout", stack, None), ...])``
  for its ranks that did not come up by the deadline;
* for every task, ``(seq, [(rank, kind, payload, exc), ...])``: ``kind`` is ``"ok"``
  (payload: the result), ``"err"`` (the traceback text; ``exc`` the pickled exception
  or None), ``"stopped"`` or ``"timeout"`` (the threaded host; payload: the rank's stack);
* before ``"ready"`` and before an answer, ``("warned", [RankWarning, ...])`` when the child's
  ranks warned since the last one (:mod:`distcheck.runners.warned`; the parent keeps them for
  the report's summary).

Results travel through plain ``pickle``: tensors are copied, not shared.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FAILURE_GRACE_S", "SHUTDOWN", "dumps_result", "init_torch_child", "run_one", "send", "send_warned",
           "tasks"]

#: the parent's message asking a child to exit
SHUTDOWN = b""
#: after the first failure, how long (seconds) to wait for the other ranks to answer
#: before the world is declared broken and torn down (the parent and the threaded host)
FAILURE_GRACE_S = 0.3


def dumps_result(kind: str, payload: Any, exc: BaseException | None = None) -> tuple[str, Any, bytes | None]:
    """``(kind, payload, pickled exception or None)``; ``payload`` must be picklable."""
    exc_bytes = None
    if exc is not None:
        try:
            exc_bytes = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            exc_bytes = None
    return (kind, payload, exc_bytes)


def run_one(fn: Callable[..., Any], ctx: Any, args: tuple[Any, ...]) -> tuple[str, Any, bytes | None]:
    """Call ``fn(ctx, *args)``; ``("ok", result, None)`` or ``("err", traceback, pickled exception)``.

    A result that cannot be pickled is an ``"err"`` naming the rank, so the parent
    never receives half a reply.
    """
    try:
        result = fn(ctx, *args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, labelled with the rank
        return dumps_result("err", traceback.format_exc(), exc)
    try:
        pickle.dumps(result)
    except Exception as exc:  # noqa: BLE001 - whatever pickle raises
        return dumps_result("err", f"result of rank {ctx.rank} is not picklable: {exc!r}\n")
    return ("ok", result, None)


def send(conn: Any, obj: Any) -> None:
    """Send one message (``obj`` pickled) on ``conn``."""
    conn.send_bytes(pickle.dumps(obj))


def send_warned(conn: Any) -> None:
    """Send the warnings this child's ranks raised since the last call, if any (``("warned", [...])``)."""
    from distcheck.runners.warned import drain

    items = drain()
    if items:
        send(conn, ("warned", items))


def tasks(conn: Any) -> Iterator[tuple[int, Callable[..., Any], list[tuple[Any, ...]], float]]:
    """Yield the parent's tasks ``(seq, fn, args_list, timeout_s)`` until it sends :data:`SHUTDOWN`."""
    while True:
        msg = conn.recv_bytes()
        if msg == SHUTDOWN:
            return
        yield pickle.loads(msg)


def init_torch_child() -> None:
    """Import torch in a child and set one intra-op thread, before any torch op.

    A child forked after the parent ran a matmul can otherwise hang in its first
    matmul (the parent's intra-op thread pool does not survive the fork).
    """
    import torch

    torch.set_num_threads(1)
