"""Run a user's sharded torch layer on one rank: build it from the case's full weights, run the
forward and the backward, and return every result the parent checks.

Shared by the tensor-parallel contracts (and by any later contract whose target is a torch
module with sharded parameters). The protocol, for a target of each kind:

* ``module``: a ``torch.nn.Module`` class built as ``cls(*ctor_args, bias=..., **kwargs)`` on
  every rank (torch.distributed is initialised, so it can ask for its rank and world size).
  Its parameters are found by name (:attr:`ParamSpec.aliases`, or the contract option
  ``param_names``), in torch's layout (a linear weight is (out_features, in_features)), each
  holding its shard along :attr:`ParamSpec.shard_dim`: rank r's contiguous block, blocks in rank
  order, sized by the split convention (``array_split``: the first ``n % tp`` ranks get one more,
  Megatron's and fairscale's split when tp divides n; ``chunk``: ``torch.chunk``, DTensor's).
  The harness casts the module to the case's dtype and copies the case's weights into it.
* ``factory``: a function ``make(ctx, case) -> module`` that builds the layer with the case's
  weights already loaded (``case.params``: canonical name -> full tensor, torch layout; plus
  ``case.dims``, ``case.tp``, ``case.rank``, ``case.dtype``, ``case.device``). Its parameters
  are then found as for ``module``, to read their shards' gradients.
* ``style`` / ``plan``: a torch ``ParallelStyle`` (``ColwiseParallel``...) or a dict of them
  (submodule name -> style), applied with ``parallelize_module`` to distcheck's own module
  (``nn.Linear``, an MLP with ``up``/``down``, an attention block with ``q_proj``...) that holds
  the case's weights. DTensor shards follow ``chunk``.

What a rank returns (plain numpy, float64 holding the dtype's values exactly): the output, the
input gradient, every parameter's local gradient and shard bounds, the output's dtype, and the
collectives :func:`~distcheck.engine.collectives.ByteCounter` saw in the forward and in the
backward. torch is imported inside the functions only.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, resolve
from distcheck.engine.world import RankContext

if TYPE_CHECKING:
    import torch

__all__ = ["SPLITS", "ParamSpec", "LayerCase", "split_bounds", "run_layer", "check_constructor", "torch_dtype"]

#: how a width is cut into tp contiguous blocks in rank order
SPLITS = ("array_split", "chunk")


@dataclass(frozen=True)
class ParamSpec:
    """A parameter of the contract's layer.

    Attributes:
        name: canonical name (``"weight"``, ``"up.bias"``).
        shard_dim: the dimension split over tp ranks, or None for a parameter every rank holds whole.
        aliases: attribute paths tried, in order, in a user's module (``("up.weight", "fc1.weight")``).
    """

    name: str
    shard_dim: int | None
    aliases: tuple[str, ...]


@dataclass
class LayerCase:
    """Everything a rank needs for one example (picklable; numpy arrays, torch layout).

    Attributes:
        tp: ranks the layer is split over (the world size).
        x: the full input; g: the full gradient of the loss with respect to the full output.
        params: canonical name -> full value (absent: the layer has no such parameter).
        specs: the contract's parameters, in order.
        input_shard: canonical name of the parameter whose dim-1 shard gives this rank's input
            columns (a row-parallel layer that takes its input already split), else None.
        output_shard: canonical name of the parameter whose dim-0 shard gives this rank's output
            columns (a column-parallel layer that does not gather), else None.
        ctor_args: positional constructor arguments of a ``module`` target.
        dims: named sizes (``in_features``...), given to factories.
        reference: distcheck's module a ``style``/``plan`` target is applied to: ``"linear"``,
            ``"mlp"``, ``"attention"`` or ``"embedding"``; ``reference_kwargs`` its settings.
        x_is_index: ``x`` holds integer ids (an embedding's input): passed as int64, no input gradient.
    """

    tp: int
    x: np.ndarray
    g: np.ndarray
    params: dict
    specs: tuple
    input_shard: str | None = None
    output_shard: str | None = None
    ctor_args: tuple = ()
    dims: dict = field(default_factory=dict)
    reference: str = "linear"
    reference_kwargs: dict = field(default_factory=dict)
    x_is_index: bool = False


def split_bounds(n: int, tp: int, split: str) -> list[tuple[int, int]]:
    """Rank-ordered ``(start, stop)`` blocks of ``n`` over ``tp`` ranks under ``split``.

    ``array_split``: sizes ``n // tp``, the first ``n % tp`` one more (``numpy.array_split``).
    ``chunk``: ``torch.chunk``: blocks of ``ceil(n / tp)``, the last ones shorter or empty.
    """
    if split == "array_split":
        q, r = divmod(n, tp)
        sizes = [q + (1 if k < r else 0) for k in range(tp)]
    else:
        c = -(-n // tp)
        sizes = [min(c, max(0, n - k * c)) for k in range(tp)]
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def check_constructor(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
    """Raise ProtocolError unless ``cls(*args, **kwargs)`` binds to the constructor's signature."""
    try:
        inspect.signature(cls).bind(*args, **kwargs)
    except TypeError as exc:
        raise ProtocolError("target", f"{cls.__module__}:{cls.__qualname__}",
                            f"must be constructible as {what} ({exc})") from None
    except ValueError:  # no signature (a C extension): tried on the ranks
        pass


# ---------------------------------------------------------------------------- building


def _reference_module(case: LayerCase, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """distcheck's own torch module for ``style``/``plan`` targets, holding the case's weights."""
    import torch
    from torch import nn

    kw = case.reference_kwargs
    module: nn.Module
    if case.reference == "linear":
        module = nn.Linear(case.dims["in_features"], case.dims["out_features"], bias="bias" in case.params)
    elif case.reference == "embedding":
        module = nn.Embedding(case.dims["num_embeddings"], case.dims["embedding_dim"])
    elif case.reference == "mlp":
        module = _MLP(case.dims["hidden_size"], case.dims["ffn_hidden_size"], "up.bias" in case.params)
    else:
        module = _Attention(case.dims["hidden_size"], kw["num_heads"], kw["num_kv_heads"], kw["head_dim"],
                            kw.get("causal", True))
    module = module.to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, value in case.params.items():
            module.get_parameter(name).copy_(torch.as_tensor(value, dtype=dtype, device=device))
    return module


@functools.cache
def _torch_modules() -> tuple[type[torch.nn.Module], type[torch.nn.Module]]:
    import torch
    from torch import nn

    class MLP(nn.Module):
        """Megatron's MLP ``down(relu(up(x)))``."""

        def __init__(self, hidden_size: int, ffn_hidden_size: int, bias: bool):
            super().__init__()
            self.up = nn.Linear(hidden_size, ffn_hidden_size, bias=bias)
            self.down = nn.Linear(ffn_hidden_size, hidden_size, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    class Attention(nn.Module):
        """Grouped-query self-attention; with ColwiseParallel q/k/v each rank holds whole heads."""

        def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, causal: bool):
            super().__init__()
            self.head_dim, self.causal = head_dim, causal
            self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
            self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)  # local heads when sharded
            k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
            if self.causal:
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, -1)
            return self.o_proj(a)

    return MLP, Attention


def _MLP(*args: Any) -> torch.nn.Module:  # builds the class lazily (torch)
    return _torch_modules()[0](*args)


def _Attention(*args: Any) -> torch.nn.Module:
    return _torch_modules()[1](*args)


def _mesh(ctx: RankContext) -> Any:
    key = "distcheck.certify.mesh"
    if key not in ctx.scratch:
        from torch.distributed.device_mesh import init_device_mesh

        ctx.scratch[key] = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("tp",))
    return ctx.scratch[key]


def _build(ctx: RankContext, target: Target, case: LayerCase, dtype: torch.dtype) -> torch.nn.Module:
    obj = resolve(target)
    if target.kind in ("style", "plan"):
        from torch.distributed.tensor.parallel import parallelize_module

        module = _reference_module(case, dtype, ctx.device)
        plan = obj() if isinstance(obj, type) else obj
        parallelize_module(module, _mesh(ctx), plan)
        return module
    if target.kind == "factory":
        import torch

        view = SimpleNamespace(
            params={k: torch.as_tensor(v, dtype=dtype, device=ctx.device) for k, v in case.params.items()},
            dims=dict(case.dims), tp=case.tp, rank=ctx.rank, dtype=dtype, device=ctx.device)
        module = obj(ctx, view)
        if not hasattr(module, "parameters") or not callable(module):
            raise ProtocolError("target", target.ref, f"must return a torch module from make(ctx, case), "
                                                      f"got {type(module).__name__}")
        return module
    kwargs = dict(target.build.get("kwargs", {}))
    if target.build.get("bias_kwarg", True):
        kwargs["bias"] = any(s.name.endswith("bias") and s.name in case.params for s in case.specs)
    try:
        module = obj(*case.ctor_args, **kwargs)
    except TypeError as exc:
        if "argument" in str(exc):  # the constructor's signature, not its body
            raise ProtocolError("target", target.ref, f"must be constructible as {obj.__name__}"
                                                      f"{tuple(case.ctor_args)} with {kwargs} ({exc})") from exc
        raise
    return module.to(device=ctx.device, dtype=dtype)


def _find(module: torch.nn.Module, spec: ParamSpec, names: dict[str, str], ref: str) -> torch.nn.Parameter:
    paths = (names[spec.name],) if spec.name in names else spec.aliases
    for path in paths:
        try:
            return module.get_parameter(path)
        except AttributeError:
            continue
    raise ProtocolError("target", ref, f"must have a parameter {spec.name!r} (tried {', '.join(paths)}; "
                                       "name it with the option param_names)")


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def _layout_error(spec: ParamSpec, local: torch.Tensor, full: np.ndarray, rank: int, tp: int, split: str) -> str | None:
    """Why ``local`` is not rank ``rank``'s block of ``full`` under the contract's layout, or None."""
    if local.dim() != full.ndim:
        return (f"parameter {spec.name} must have {full.ndim} dims (torch layout {tuple(full.shape)}), "
                f"has shape {tuple(local.shape)}")
    for d in range(full.ndim):
        if d != spec.shard_dim and local.shape[d] != full.shape[d]:
            return (f"parameter {spec.name} has shape {tuple(local.shape)}: dim {d} must be {full.shape[d]} "
                    f"(torch layout {tuple(full.shape)}, split along dim {spec.shard_dim})")
    if spec.shard_dim is not None:
        sizes = [b - a for a, b in split_bounds(full.shape[spec.shard_dim], tp, split)]
        if local.shape[spec.shard_dim] != sizes[rank]:
            return (f"rank {rank} holds {local.shape[spec.shard_dim]} of the {full.shape[spec.shard_dim]} entries of "
                    f"{spec.name} along dim {spec.shard_dim}; the {split} split over tp={tp} gives sizes {sizes}")
    return None


def _locate(ctx: RankContext, module: torch.nn.Module, case: LayerCase, target: Target) -> tuple[dict, dict, dict]:
    """Find the contract's parameters in ``module``.

    Returns ``(found, bounds, errors)``: canonical name -> (parameter, local tensor) for those that
    follow the layout; canonical name -> this rank's ``(lo, hi)`` block under the split convention
    (None when replicated); canonical name -> why a parameter does not follow the layout.

    A ``module`` target must follow it (the harness loads the weights): a missing parameter or a
    wrong shape is a ProtocolError, a wrong shard size (the layer splits differently) an
    AssertionError, which fails the example. A ``factory`` loaded its own weights: a parameter
    that does not follow the layout only fails the gradient check (its ``errors`` entry).
    """
    names = target.build.get("param_names", {})
    split = target.build.get("split", "array_split")
    found, bounds, errors = {}, {}, {}
    for spec in case.specs:
        if spec.name not in case.params:
            continue
        full = case.params[spec.name]
        bounds[spec.name] = (None if spec.shard_dim is None
                             else split_bounds(full.shape[spec.shard_dim], case.tp, split)[ctx.rank])
        try:
            p = _find(module, spec, names, target.ref)
        except ProtocolError as exc:
            if target.kind != "factory":
                raise
            errors[spec.name] = exc.rule
            continue
        local = _local(p)
        problem = _layout_error(spec, local, full, ctx.rank, case.tp, split)
        if problem is None:
            found[spec.name] = (p, local)
        elif target.kind == "factory":
            errors[spec.name] = problem
        elif problem.startswith("rank"):
            raise AssertionError(problem)
        else:
            raise ProtocolError("target", target.ref, problem)
    return found, bounds, errors


def _load(found: dict, bounds: dict, case: LayerCase, dtype: torch.dtype) -> None:
    import torch

    with torch.no_grad():
        for name, (_, local) in found.items():
            full = torch.as_tensor(case.params[name], dtype=dtype, device=local.device)
            if bounds[name] is not None:
                dim = next(s.shard_dim for s in case.specs if s.name == name)
                full = full.narrow(dim, bounds[name][0], bounds[name][1] - bounds[name][0])
            local.copy_(full)


# ---------------------------------------------------------------------------- running


def _numpy(t: torch.Tensor) -> np.ndarray:
    import torch

    return t.detach().to(torch.float64).cpu().numpy()


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _output(out: Any, ref: str) -> torch.Tensor:
    import torch

    if isinstance(out, (tuple, list)) and out:
        out = out[0]  # Megatron-style (output, bias) returns: the output comes first
    if hasattr(out, "to_local") and not hasattr(out, "trigger_wait"):  # a DTensor output
        out = out.to_local()
    if not isinstance(out, torch.Tensor):
        raise ProtocolError("target", ref, f"forward must return a tensor (or a tuple starting with one), "
                                           f"got {type(out).__name__}")
    return out


def run_layer(ctx: RankContext, target: Target, case: LayerCase, dtype_name: str) -> dict:
    """Build the target on this rank, run forward and backward, and return the results (see the module doc)."""
    import torch

    from distcheck.engine.collectives import ByteCounter
    from distcheck.engine.contracts.adapters import prepare

    dtype = torch_dtype(dtype_name)
    prepare(ctx, target)
    module = _build(ctx, target, case, dtype)
    found, bounds, errors = _locate(ctx, module, case, target)
    if target.kind == "module":
        _load(found, bounds, case, dtype)
    if case.x_is_index:
        x = torch.as_tensor(case.x, dtype=torch.long, device=ctx.device)
    else:
        x = torch.as_tensor(case.x, dtype=dtype, device=ctx.device)
        if case.input_shard is not None:
            lo, hi = bounds[case.input_shard]
            x = x[..., lo:hi]
        x = x.detach().clone().requires_grad_(True)
    g = torch.as_tensor(case.g, dtype=dtype, device=ctx.device)
    if case.output_shard is not None:
        lo, hi = bounds[case.output_shard]
        g = g[..., lo:hi]
    with ByteCounter() as forward:
        out = _output(module(x), target.ref)
    if out.shape != g.shape:
        raise AssertionError(f"rank {ctx.rank}: output shape {tuple(out.shape)}, expected {tuple(g.shape)}")
    with ByteCounter() as backward:
        torch.autograd.backward(out, g)
    grads, grad_dtypes, grad_errors = {}, {}, {}
    for name, (p, _) in found.items():
        grad = p.grad
        if grad is not None and hasattr(grad, "placements") and tuple(grad.placements) != tuple(p.placements):
            grad_errors[name] = (f"the gradient of {name} is a DTensor placed {tuple(grad.placements)} while the "
                                 f"parameter is placed {tuple(p.placements)} (local gradient of shape "
                                 f"{tuple(grad.to_local().shape)}, parameter shard {tuple(p.to_local().shape)}); "
                                 "its values are checked on the parameter's placement")
            grad = grad.redistribute(placements=p.placements)  # after the backward's counter: not counted
        grad = None if grad is None else _local(grad)
        grads[name] = None if grad is None else _numpy(grad)
        grad_dtypes[name] = None if grad is None else _dtype_name(grad)
    return {
        "out": _numpy(out), "out_dtype": _dtype_name(out),
        "dx": None if x.grad is None else _numpy(x.grad), "dx_dtype": None if x.grad is None else _dtype_name(x.grad),
        "grads": grads, "grad_dtypes": grad_dtypes, "param_errors": errors, "grad_errors": grad_errors,
        "bounds": bounds,
        "forward": list(forward.records), "backward": list(backward.records),
    }
