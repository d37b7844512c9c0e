"""Count the collectives a rank issues, with their full size S in bytes: :func:`ByteCounter`.

:func:`ByteCounter` is a ``TorchDispatchMode`` that records every collective that reaches the
c10d dispatcher (``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``,
their coalesced forms, and the functional collectives DTensor issues) with its full size ``S``
in bytes, in the nccl-tests convention of the ``comm.bytes_per_rank.*`` closed forms: the tensor
every rank holds for all-reduce, the concatenated OUTPUT of all-gather, the full INPUT of
reduce-scatter (nccl-tests ``doc/PERFORMANCE.md``). Dispatch modes are per thread, so the
counter works unchanged on the threaded backend, where the c10d calls of ``torch.distributed``
(which bypass the dispatcher there) are recorded from the threaded process group itself.

Used by the contracts' rank harness (:mod:`distcheck.engine.contracts.layer`) and by the
packages' real-backend checks. torch is imported inside the functions only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distcheck.core.vocab import Collective

if TYPE_CHECKING:
    import torch

__all__ = ["ByteCounter", "classify"]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _sum_nbytes(ts: Any) -> int:  # a tensor, or a (nested) list or tuple of them
    if isinstance(ts, (list, tuple)):
        return sum(_sum_nbytes(t) for t in ts)
    return _nbytes(ts)


def classify(func: Any, args: Sequence[Any]) -> tuple[str, int] | None:  # noqa: C901 - one branch per torch collective op name
    """(collective, S in bytes) for a collective op, else None. S in the full-size convention."""
    name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
    ns = getattr(func, "namespace", "")
    if ns == "c10d":
        if name in ("allreduce_", "allreduce_coalesced_"):
            return Collective.ALL_REDUCE, _sum_nbytes(args[0])
        if name in ("_allgather_base_", "allgather_into_tensor_coalesced_"):
            return Collective.ALL_GATHER, _sum_nbytes(args[0])  # outputs
        if name in ("allgather_", "allgather_coalesced_"):
            return Collective.ALL_GATHER, _sum_nbytes(args[0])  # list of output lists
        if name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            return Collective.REDUCE_SCATTER, _sum_nbytes(args[1])  # inputs
        if name == "reduce_scatter_":
            return Collective.REDUCE_SCATTER, _sum_nbytes(args[1])  # list of input lists
        if name in ("alltoall_base_", "alltoall_"):
            return Collective.ALL_TO_ALL, _sum_nbytes(args[1])
        if name == "broadcast_":
            return Collective.BROADCAST, _sum_nbytes(args[0])
        # rooted collectives: recorded by name, S = first tensor argument
        if name in ("reduce_", "gather_", "scatter_"):
            return name.rstrip("_"), _sum_nbytes(args[0])
        return None
    if ns in ("_c10d_functional", "c10d_functional"):
        if name in (Collective.ALL_REDUCE, "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_"):
            return Collective.ALL_REDUCE, _sum_nbytes(args[0])
        if name in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
            return Collective.ALL_GATHER, _sum_nbytes(args[0]) * int(args[1])  # input * group_size
        if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
            return Collective.REDUCE_SCATTER, _sum_nbytes(args[0])
        if name == "all_to_all_single":
            return Collective.ALL_TO_ALL, _sum_nbytes(args[0])
        if name == Collective.BROADCAST:
            return Collective.BROADCAST, _sum_nbytes(args[0])
    return None


# The threaded backend's process group (torch's ProcessLocalGroup) is a Python subclass, so
# ``dist.all_reduce`` & co. call its methods directly, without passing the c10d dispatcher that
# ByteCounter watches. Its methods are wrapped once per process; a wrapped call is recorded by the
# innermost ByteCounter active on the calling thread, unless it runs inside an op ByteCounter
# already recorded (functional collectives reach the same methods).
_TLS = threading.local()
_THREADED_HOOKS: dict[str, bool] = {"installed": False}
_THREADED_LOCK = threading.Lock()

#: ProcessLocalGroup method -> (collective, function of the call's arguments giving S), or None
#: for methods that are only guarded (barrier, and methods implemented by calling another one)
_THREADED_METHODS = {
    "allreduce": (Collective.ALL_REDUCE, lambda a: _sum_nbytes(a[0])),
    "allreduce_coalesced": (Collective.ALL_REDUCE, lambda a: _sum_nbytes(a[0])),
    "allgather": (Collective.ALL_GATHER, lambda a: _sum_nbytes(a[0])),
    "all_gather_single": (Collective.ALL_GATHER, lambda a: _nbytes(a[0])),
    Collective.REDUCE_SCATTER: (Collective.REDUCE_SCATTER, lambda a: _sum_nbytes(a[1])),
    "reduce_scatter_single": (Collective.REDUCE_SCATTER, lambda a: _nbytes(a[1])),
    Collective.BROADCAST: (Collective.BROADCAST, lambda a: _sum_nbytes(a[0])),
    "alltoall": (Collective.ALL_TO_ALL, lambda a: _sum_nbytes(a[1])),
    "all_to_all_single": (Collective.ALL_TO_ALL, lambda a: _nbytes(a[1])),
    "scatter": ("scatter", lambda a: _sum_nbytes(a[0])),
    "gather": ("gather", lambda a: _sum_nbytes(a[1])),
    "barrier": None,
}


def _counter_stack() -> list:
    stack = getattr(_TLS, "stack", None)
    if stack is None:
        stack = _TLS.stack = []
        _TLS.depth = 0
    return stack


def _install_threaded_hooks() -> None:
    """Wrap ProcessLocalGroup's collectives (once per process) when this thread's world is threaded."""
    import torch.distributed as dist

    if _THREADED_HOOKS["installed"] or not dist.is_initialized() or dist.get_backend() != "threaded":
        return
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    def wrap(method: str, spec: tuple[str, Callable[[tuple[Any, ...]], int]] | None) -> Callable[..., Any]:
        original = getattr(ProcessLocalGroup, method)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = _counter_stack()
            if spec is not None and stack and _TLS.depth == 0:
                stack[-1].records.append((spec[0], spec[1](args)))
            _TLS.depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                _TLS.depth -= 1

        counted.__wrapped__ = original  # type: ignore[attr-defined]
        return counted

    with _THREADED_LOCK:
        if not _THREADED_HOOKS["installed"]:
            for method, spec in _THREADED_METHODS.items():
                if hasattr(ProcessLocalGroup, method):
                    setattr(ProcessLocalGroup, method, wrap(method, spec))
            _THREADED_HOOKS["installed"] = True


def ByteCounter() -> Any:  # a factory: torch is imported lazily
    """A ``TorchDispatchMode`` that records the collectives run under it.

    Use inside a rank::

        with ByteCounter() as counter:
            dist.all_reduce(t)
        counter.records  # [(Collective.ALL_REDUCE, S_bytes), ...]
        counter.total(Collective.ALL_REDUCE)  # sum of S

    Records follow the full-size convention of the ``comm.bytes_per_rank.*`` closed forms.
    Ops of a DTensor are seen after DTensor lowers them to functional
    collectives. Point-to-point ops are not collectives and are not recorded;
    rooted collectives (``reduce``, ``gather``, ``scatter``) are recorded by
    name with S = their first tensor argument, so a count check names them.
    On the threaded backend, ``torch.distributed``'s c10d calls are recorded
    as well (see ``_install_threaded_hooks``), each once.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _ByteCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func: Any, types: Sequence[type], args: Sequence[Any] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            import torch

            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            from torch.distributed.tensor import DTensor

            if any(t is DTensor or (isinstance(t, type) and issubclass(t, DTensor)) for t in types):
                return NotImplemented
            hit = classify(func, args)
            if hit is None:
                return func(*args, **kwargs)
            self.records.append(hit)
            _counter_stack()
            _TLS.depth += 1  # the threaded group's methods reached from here are this one op
            try:
                return func(*args, **kwargs)
            finally:
                _TLS.depth -= 1

        def __enter__(self) -> Any:
            _counter_stack().append(self)
            try:
                _install_threaded_hooks()
                return super().__enter__()
            except BaseException:
                _counter_stack().remove(self)
                raise

        def __exit__(self, *exc: object) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                stack = _counter_stack()
                if stack and stack[-1] is self:
                    stack.pop()

        def total(self, collective: str) -> int:
            return sum(s for c, s in self.records if c == collective)

        def count(self, collective: str) -> int:
            return sum(1 for c, _ in self.records if c == collective)

    return _ByteCounter()
