"""The ``dropless`` variant of the ``moe-layer`` contract: no capacity, variable split sizes.

Dropless MoE (torchtitan's ``AllToAllTokenDispatcher``, ``torchtitan/models/common/token_dispatcher.py``;
Megatron-core's ``MoEAlltoAllTokenDispatcher``; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §3.2) keeps
every choice: rank r sends one row of h elements per (token, choice) to the rank holding the chosen expert. The
ranks first exchange their per-expert counts (an integer all-to-all of E counts, or an all-gather), then each
data all-to-all is an ``all_to_all_single`` with ``input_split_sizes`` and ``output_split_sizes``:

* the dispatch: rank r sends ``a[r][j]`` rows to rank j (its tokens' choices of rank j's experts) and receives
  ``b[r][j] = a[j][r]`` rows from rank j;
* the combine: the expert outputs go back, ``b[r]`` sent and ``a[r]`` received;
* the backward: the transposes of the two, the same pairs of split sizes swapped.

So each phase's data all-to-alls on rank r are, as a multiset of (bytes sent to each rank, bytes received from
each rank), ``{(a_r h B, b_r h B), (b_r h B, a_r h B)}``, B the bytes of one element; the bytes a rank sends to
the others are the sums less its own split. Integer collectives (the counts) are not data and are not part of
these rows. :func:`split_recorder` records every all-to-all's split sizes in bytes (from torch's dispatcher on
gloo and NCCL worlds, from the process group's methods on the threaded backend); :func:`expected_splits`
computes ``a`` and ``b`` from the reference's routing.

A rank whose experts receive no rows still takes part in every all-to-all, forward and backward: its combine's
input must stay in the autograd graph (an expert run on zero rows is), or its backward issues no all-to-all and
the other ranks wait. gloo itself moves zero-length splits correctly on torch 2.13 (``tests/test_ep_dropless.py``
pins it in plain torch.distributed); when a receiver's split is larger than what its sender sends, gloo leaves the
rest of the output as it was, and when it is smaller, gloo ends the receiving process (``gloo::EnforceNotMet``):
wrong split sizes show as wrong outputs or a rank that died, never as a hang.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from distcheck.core.vocab import Collective
from distcheck.engine.contracts.contract import Outcome

__all__ = ["expected_splits", "split_recorder", "classify_split", "check_splits"]

#: one recorded data all-to-all: (bytes sent to each rank, bytes received from each rank)
Splits = tuple[tuple[int, ...], tuple[int, ...]]


def expected_splits(experts: np.ndarray, ep: int, num_experts: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(a, b)`` rows per rank pair: ``a[r][j]`` the choices of rank r's tokens routed to rank j's experts
    (``experts`` (T, k) the chosen experts of the whole batch, rank r's tokens rows ``r T/ep ..``), and
    ``b[r][j] = a[j][r]``."""
    T = experts.shape[0]
    n, m = T // ep, num_experts // ep
    a = [[int(np.sum(experts[r * n:(r + 1) * n] // m == j)) for j in range(ep)] for r in range(ep)]
    b = [[a[j][r] for j in range(ep)] for r in range(ep)]
    return a, b


def classify_split(func: Any, args: Sequence[Any], world_size: int) -> tuple[bool, Splits] | None:
    """``(floating, (sent bytes per rank, received bytes per rank))`` for an all-to-all op reaching torch's
    dispatcher (``c10d::alltoall_base_``, ``c10d::alltoall_``, ``_c10d_functional::all_to_all_single``), else
    None. Empty split lists mean equal splits of dim 0 over the group."""
    name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
    ns = getattr(func, "namespace", "")
    if ns == "c10d" and name == "alltoall_base_":
        out, inp, group, out_sizes, in_sizes = args[0], args[1], args[2], args[3], args[4]
        size = _group_size(group, world_size)
        return inp.is_floating_point(), (_bytes(inp, in_sizes, size), _bytes(out, out_sizes, size))
    if ns == "c10d" and name == "alltoall_":
        outs, ins = args[0], args[1]
        return (bool(ins) and ins[0].is_floating_point(),
                (tuple(t.numel() * t.element_size() for t in ins), tuple(t.numel() * t.element_size() for t in outs)))
    if ns in ("_c10d_functional", "c10d_functional") and name == "all_to_all_single":
        inp, out_sizes, in_sizes = args[0], args[1], args[2]
        row = _row_bytes(inp)
        sent = _bytes(inp, in_sizes, world_size)
        got = tuple(int(s) * row for s in out_sizes) if out_sizes else sent
        return inp.is_floating_point(), (sent, got)
    return None


def _group_size(group: Any, default: int) -> int:
    try:
        return int(group.size())
    except (AttributeError, RuntimeError, TypeError):
        return default


def _row_bytes(t: Any) -> int:
    rest = 1
    for d in t.shape[1:]:
        rest *= int(d)
    return rest * t.element_size()


def _bytes(t: Any, sizes: Sequence[int], group: int) -> tuple[int, ...]:
    row = _row_bytes(t)
    if sizes:
        return tuple(int(s) * row for s in sizes)
    rows = int(t.shape[0]) if t.dim() else 1
    return tuple([rows // group * row] * group)


_TLS = threading.local()
_THREADED: dict[str, bool] = {"installed": False}
_LOCK = threading.Lock()


def _stack() -> list:
    stack = getattr(_TLS, "stack", None)
    if stack is None:
        stack = _TLS.stack = []
        _TLS.depth = 0
    return stack


def _install_threaded_hooks() -> None:
    """On the threaded backend ``torch.distributed`` calls the process group's methods directly, past the
    dispatcher: wrap its ``all_to_all_single`` and ``alltoall`` once per process, recording into the innermost
    recorder of the calling thread (unless the call is inside an op the dispatcher already recorded)."""
    import torch.distributed as dist

    if _THREADED["installed"] or not dist.is_initialized() or dist.get_backend() != "threaded":
        return
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    def record(args: tuple[Any, ...], single: bool) -> tuple[bool, Splits]:
        size = dist.get_world_size()
        if single:
            out, inp, out_sizes, in_sizes = args[0], args[1], args[2] or [], args[3] or []
            return inp.is_floating_point(), (_bytes(inp, in_sizes, size), _bytes(out, out_sizes, size))
        outs, ins = args[0], args[1]
        return (bool(ins) and ins[0].is_floating_point(),
                (tuple(t.numel() * t.element_size() for t in ins), tuple(t.numel() * t.element_size() for t in outs)))

    def wrap(method: str, single: bool) -> Any:
        original = getattr(ProcessLocalGroup, method)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = _stack()
            if stack and _TLS.depth == 0:
                stack[-1].records.append(record(args, single))
            _TLS.depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                _TLS.depth -= 1

        counted.__wrapped__ = original  # type: ignore[attr-defined]
        return counted

    with _LOCK:
        if not _THREADED["installed"]:
            for method, single in (("all_to_all_single", True), ("alltoall", False)):
                if hasattr(ProcessLocalGroup, method):
                    setattr(ProcessLocalGroup, method, wrap(method, single))
            _THREADED["installed"] = True


def split_recorder(world_size: int) -> Any:  # a factory: torch is imported lazily
    """A ``TorchDispatchMode`` whose ``records`` list every all-to-all run under it as
    :func:`classify_split` gives it (on the threaded backend, from the process group's methods). Point-to-point
    and other collectives are not recorded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Splits(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[tuple[bool, Splits]] = []

        def __torch_dispatch__(self, func: Any, types: Sequence[type], args: Sequence[Any] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            import torch

            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            from torch.distributed.tensor import DTensor

            if any(t is DTensor or (isinstance(t, type) and issubclass(t, DTensor)) for t in types):
                return NotImplemented
            hit = classify_split(func, args, world_size)
            if hit is None:
                return func(*args, **kwargs)
            self.records.append(hit)
            _stack()
            _TLS.depth += 1  # the threaded group's methods reached from here are this one op
            try:
                return func(*args, **kwargs)
            finally:
                _TLS.depth -= 1

        def __enter__(self) -> Any:
            _stack().append(self)
            try:
                _install_threaded_hooks()
                return super().__enter__()
            except BaseException:
                _stack().remove(self)
                raise

        def __exit__(self, *exc: object) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                stack = _stack()
                if stack and stack[-1] is self:
                    stack.pop()

    return _Splits()


def _show(records: Sequence[Splits]) -> str:
    if not records:
        return "none"
    return ", ".join(f"sent {list(s)} B / received {list(g)} B" for s, g in sorted(records))


def check_splits(phase: str, a: list[list[int]], b: list[list[int]], row_bytes: int,
                 got_per_rank: Sequence[Sequence[tuple[bool, Splits]]]) -> Outcome:
    """Every rank's floating-point all-to-alls of ``phase`` against the dispatch and the combine at the split
    sizes ``a``, ``b`` (rows; module doc), ``row_bytes`` = h B. The message lists, per rank at fault, what it
    issued and what the split sizes give, and the bytes each sends to the other ranks."""
    bad, ranks = [], []
    for r, recs in enumerate(got_per_rank):
        send = tuple(x * row_bytes for x in a[r])
        recv = tuple(x * row_bytes for x in b[r])
        want = Counter([(send, recv), (recv, send)])
        mine = [s for floating, s in recs if floating]
        if Counter(mine) == want:
            continue
        ranks.append(r)
        out = sum(send) - send[r]
        back = sum(recv) - recv[r]
        bad.append(f"rank {r}: {_show(mine)}; the split sizes give the dispatch sent {list(send)} B, received "
                   f"{list(recv)} B, and the combine the reverse (rows {a[r]} out, {b[r]} in, of {row_bytes} B; "
                   f"{out} B sent to the other ranks and {back} B received from them)")
    if not bad:
        return Outcome(True, max_error=0.0, bound=0.0)
    return Outcome(False, bound=0.0, ranks=tuple(ranks),
                   message=f"{phase} {Collective.ALL_TO_ALL}s differ from two all_to_all_single of the actual "
                           f"split sizes (one row per kept choice, counts exchanged first): " + "; ".join(bad))
