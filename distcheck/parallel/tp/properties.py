"""Tensor-parallel properties: column, row, MLP (ReLU and SwiGLU, fused or not), layer
norm over a sharded hidden dim, and attention split by heads; any tp, uneven shards.

Exactness regimes (:mod:`distcheck.core.exactness`):

- column / row / ReLU MLP / layer norm: integer-valued inputs, so the sharded
  result equals the single-device one bit for bit (row-parallel only reorders a
  sum of exact integers; see :func:`distcheck.strategies.mlp_cases` for the bound).
- SwiGLU and attention apply transcendental functions (exp) elementwise. They are
  evaluated on the same exact integer operands in both paths, and numpy's ufuncs
  are deterministic per value, so the activations agree; what differs is the order
  of the final sum over ffn units / heads (the all-reduce). Against the exact sum of
  the single-device activations times the output weight, any order of a length-k dot
  product is within gamma_k * sum|h_j W_j| (Higham eq. (3.5)).

Implementation slots (``impl``) have the signatures of the references in
:mod:`distcheck.parallel.tp` / :mod:`distcheck.parallel.tp`, listed per property. The
properties that state a number of collectives (``tp.row.exact``, ``tp.mlp.exact``,
``tp.swiglu.bounded``, ``tp.attention.bounded``) require it: the implementation
takes ``log=`` (a list) and appends ``("all_reduce", shape)`` per all-reduce, and
the count must equal the closed form (``tp.row.allreduce_count``,
``tp.mlp.allreduce_per_forward``, ``tp.attention.allreduce_per_forward``; at
tp = 1, 0 is also right). An empty log at tp >= 2 fails the claim. An
implementation without ``log`` fails with an ImplementationError (kind
``"contract"``) unless the property is called with ``require_log=False``, which
checks the numbers only.

``tp.layer_norm.sharded_hidden``'s default implementation is
:func:`distcheck.parallel.tp.sharded_layer_norm`, next to ``layer_norm`` in the reference.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ImplementationError, PropertyFailure
from distcheck.core.exactness import assert_bitwise_equal, assert_within, gamma, to_exact
from distcheck.core.vocab import Collective
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.tp import strategies as ds
from distcheck.parallel.tp.reference import sharded_layer_norm

__all__ = [
    "column_exact",
    "row_exact",
    "mlp_exact",
    "swiglu_bounded",
    "swiglu_fused_bounded",
    "layer_norm_sharded_hidden",
    "attention_bounded",
    "sharded_layer_norm",
]


def _ref(name: str) -> Callable[..., Any]:
    from distcheck.parallel.tp import reference as tp

    return getattr(tp, name)


def _accepts_log(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` takes a ``log`` keyword (or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == "log" or p.kind is p.VAR_KEYWORD for p in params)


def _call_logged(what: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, list | None]:
    """Call the implementation, passing ``log=[]`` when it accepts one.

    Returns ``(result, log)``; ``log`` is None when ``fn`` takes no ``log`` keyword.
    """
    if _accepts_log(fn):
        log: list = []
        return call_impl(what, fn, *args, log=log), log
    return call_impl(what, fn, *args), None


def _check_allreduces(log: list | None, form: str, tp: int, what: str, require_log: bool) -> None:
    """The all-reduces recorded in ``log`` must number what the closed form says.

    - ``tp >= 2``: exactly the closed form's count (1 for every TP block here). An
      implementation that takes ``log`` and records no all-reduce FAILS: the claim is
      "one all-reduce per forward", and zero is not one.
    - ``tp == 1``: the all-reduce over one rank is a no-op; 0 or the closed form's count.
    - ``log`` is None (the implementation takes no ``log=``): with ``require_log`` (the
      default of every property that states a count) this raises ImplementationError
      (kind ``"contract"``): the count cannot be checked, and a property never passes a
      claim it did not check. ``require_log=False`` checks the numbers only.

    Entries are ``("all_reduce", shape)``, as :mod:`distcheck.parallel.tp` appends them; other
    entries are ignored.
    """
    from distcheck.engine.catalogue import get

    expected = int(get(form).evaluate())
    if log is None:
        if require_log:
            raise ImplementationError(
                f"implementation {what} takes no log= keyword, so its all-reduce count cannot be checked against "
                f"{form} = {expected}; append ('all_reduce', shape) to log for each all-reduce, or pass "
                "require_log=False to check the numbers only", "contract")
        return
    got = sum(1 for entry in log if isinstance(entry, tuple) and entry and entry[0] == Collective.ALL_REDUCE)
    if got == expected or (tp == 1 and got == 0):
        return
    none = " (the implementation takes log= but recorded no all-reduce)" if got == 0 else ""
    raise PropertyFailure(f"{what} (tp={tp}): {got} all-reduces per forward{none}, closed form {form} says {expected}",
                          expected=expected, got=got)


def column_exact(case: ds.LinearCase, *, impl: Callable[..., ArrayLike] | None = None) -> None:
    """Column-parallel linear (concatenated) == x @ W + b, bit for bit."""
    impl = impl or _ref("column_parallel")
    got = call_impl("column_parallel", impl, case.x, case.W, case.tp, case.b)
    full = case.x @ case.W if case.b is None else case.x @ case.W + case.b
    assert_bitwise_equal(full, got, what=f"column-parallel (tp={case.tp}) vs x @ W")


def row_exact(case: ds.LinearCase, *, impl: Callable[..., ArrayLike] | None = None, require_log: bool = True) -> None:
    """Row-parallel linear (partials summed by one all-reduce, bias added once) == x @ W + b, bit
    for bit; all-reduces recorded in ``log`` == tp.row.allreduce_count (see :func:`_check_allreduces`)."""
    impl = impl or _ref("row_parallel")
    got, log = _call_logged("row_parallel", impl, case.x, case.W, case.tp, case.b)
    full = case.x @ case.W if case.b is None else case.x @ case.W + case.b
    assert_bitwise_equal(full, got, what=f"row-parallel (tp={case.tp}) vs x @ W + b")
    _check_allreduces(log, "tp.row.allreduce_count", case.tp, "row_parallel", require_log)


def mlp_exact(case: ds.MLPCase, *, impl: Callable[..., ArrayLike] | None = None, require_log: bool = True) -> None:
    """Megatron MLP (column-split W_up, local ReLU, row-split W_down, one all-reduce)
    == relu(x W_up) W_down + b_down, bit for bit; all-reduces == tp.mlp.allreduce_per_forward."""
    impl = impl or _ref("megatron_mlp")
    got, log = _call_logged("megatron_mlp", impl, case.x, case.W_up, case.W_down, case.tp, "relu", None, case.b_down)
    full = _ref("mlp")(case.x, case.W_up, case.W_down, "relu", None, case.b_down)
    assert_bitwise_equal(full, got, what=f"tensor-parallel MLP (tp={case.tp}) vs single device")
    _check_allreduces(log, "tp.mlp.allreduce_per_forward", case.tp, "megatron_mlp", require_log)


def _swiglu_expected(case: ds.MLPCase) -> tuple[np.ndarray, np.ndarray]:
    silu = _ref("silu")
    h = silu(case.x @ case.W_gate) * (case.x @ case.W_up)
    expected = to_exact(h) @ to_exact(case.W_down)
    bound = gamma(case.W_down.shape[0]) * (to_exact(np.abs(h)) @ to_exact(np.abs(case.W_down)))
    return expected, bound


def swiglu_bounded(case: ds.MLPCase, *, impl: Callable[..., ArrayLike] | None = None, require_log: bool = True) -> None:
    """TP SwiGLU (gate and up column-split on the same ffn shards) within gamma_ffn |h||W_down|
    of the exact product of the single-device activations h with W_down."""
    impl = impl or _ref("tp_swiglu_mlp")
    with np.errstate(over="ignore"):  # exp(-z) overflows to inf for very negative z: silu -> -0.0, correctly
        got, log = _call_logged("tp_swiglu_mlp", impl, case.x, case.W_gate, case.W_up, case.W_down, case.tp)
        expected, bound = _swiglu_expected(case)
    assert_within(expected, got, bound, what=f"tensor-parallel SwiGLU (tp={case.tp})")
    _check_allreduces(log, "tp.mlp.allreduce_per_forward", case.tp, "tp_swiglu_mlp", require_log)


def swiglu_fused_bounded(case: ds.MLPCase, *, impl: Callable[..., ArrayLike] | None = None) -> None:
    """TP SwiGLU from a fused [gate | up] weight (each rank must get the SAME ffn slice of
    gate and of up) within gamma_ffn |h||W_down| of the exact single-device result."""
    impl = impl or _ref("tp_swiglu_mlp_fused")
    W_fused = np.concatenate([case.W_gate, case.W_up], axis=1)
    with np.errstate(over="ignore"):
        got, _ = _call_logged("tp_swiglu_mlp_fused", impl, case.x, W_fused, case.W_down, case.tp)
        expected, bound = _swiglu_expected(case)
    assert_within(expected, got, bound, what=f"fused gate/up SwiGLU (tp={case.tp})")


def layer_norm_sharded_hidden(case: ds.NormCase, *,
                              impl: Callable[..., Sequence[ArrayLike]] = sharded_layer_norm) -> None:
    """Layer norm over a hidden dim split across tp ranks == single-device layer norm, bit
    for bit (hidden a power of two and integer inputs: mean and variance are exact dyadic
    numbers; sqrt and the division are correctly rounded IEEE operations on the same values)."""
    from distcheck.parallel.tp.reference import split_bounds, split_sizes

    shards = [case.x[:, lo:hi] for lo, hi in split_bounds(split_sizes(case.x.shape[1], case.tp))]
    got = call_impl("sharded layer norm", impl, shards, 1.0)
    full = _ref("layer_norm")(case.x, eps=1.0)
    assert_bitwise_equal(full, np.concatenate(got, axis=-1), what=f"layer norm over hidden sharded tp={case.tp}")


def attention_bounded(case: ds.AttentionCase, *, impl: Callable[..., ArrayLike] | None = None,
                      require_log: bool = True) -> None:
    """Attention split by heads (GQA groups kept whole) within gamma_{H e} |heads||Wo| of the
    exact product of the single-device head outputs with Wo; one all-reduce per forward."""
    from distcheck.parallel.tp import heads as att

    impl = impl or att.tp_attention
    got, log = _call_logged("tp_attention", impl, case.x, case.Wq, case.Wk, case.Wv, case.Wo, case.num_heads,
                            case.num_kv_heads, case.tp, True)
    heads = att.attention_heads(case.x, case.Wq, case.Wk, case.Wv, case.num_heads, case.num_kv_heads, True)
    expected = to_exact(heads) @ to_exact(case.Wo)
    bound = gamma(case.Wo.shape[0]) * (to_exact(np.abs(heads)) @ to_exact(np.abs(case.Wo)))
    assert_within(expected, got, bound, what=f"tensor-parallel attention (tp={case.tp})")
    _check_allreduces(log, "tp.attention.allreduce_per_forward", case.tp, "tp_attention", require_log)


def _a(rows: ArrayLike) -> np.ndarray:
    return np.array(rows, dtype=float)


def _linear_edges() -> tuple[ds.LinearCase, ...]:
    """The lesson's worked example (tp = 2 divides both widths), one rank (the all-reduce is a
    no-op), then tp = 2 with 3 input and output features (neither divisible) and a bias."""
    lesson = ds.LinearCase(x=_a([[1, 2]]), W=_a([[1, 0, 2, 1], [0, 1, 1, 3]]), tp=2)
    single = ds.LinearCase(x=_a([[1, 2]]), W=_a([[1], [3]]), tp=1, b=_a([1]))
    uneven = ds.LinearCase(x=_a([[1, 2, 3]]), W=_a([[1, 0, 2], [0, 1, 1], [2, 1, 0]]), tp=2, b=_a([1, -1, 2]))
    return (uneven, lesson, single)


def _mlp_edges() -> tuple[ds.MLPCase, ...]:
    """tp = 2 over ffn = 3 (not divisible) with pre-activations of both signs and a bias: a row
    split of W_up takes relu of PARTIAL sums (relu(1) + relu(-1) != relu(0))."""
    return (ds.MLPCase(x=_a([[1, -1]]), W_up=_a([[1, 0, 1], [1, 0, -1]]), W_down=_a([[1, 1], [0, 1], [1, 0]]), tp=2,
                       b_down=_a([1, 0])),)


def _swiglu_edges() -> tuple[ds.MLPCase, ...]:
    """tp = 2 over ffn = 3: each rank must take the same ffn slice of gate and of up."""
    return (ds.MLPCase(x=_a([[1, -1]]), W_up=_a([[1, 2, 1], [0, 1, -1]]), W_down=_a([[1, 1], [0, 1], [1, 0]]), tp=2,
                       W_gate=_a([[1, 0, 2], [-1, 1, 0]])),)


def _norm_edges() -> tuple[ds.NormCase, ...]:
    """Two and four ranks over a hidden size of 4: no shard sees the row's mean or variance."""
    return (ds.NormCase(x=_a([[0, 1, 2, 5]]), tp=2), ds.NormCase(x=_a([[0, 1, 2, 5]]), tp=4))


def _attention_edges() -> tuple[ds.AttentionCase, ...]:
    """GQA: 4 query heads over 2 kv heads (2 per group), tp = 2, two tokens (causal)."""
    return (ds.AttentionCase(x=_a([[1, 0], [0, 1]]), Wq=_a([[1, 0, 1, -1], [0, 1, 1, 0]]), Wk=_a([[1, 0], [1, 1]]),
                             Wv=_a([[1, 2], [0, 1]]), Wo=_a([[1, 0], [0, 1], [1, 1], [2, 0]]),
                             num_heads=4, num_kv_heads=2, head_dim=1, tp=2),)


_linear = lambda: ds.linear_cases(max_tp=4, max_batch=2, max_features=6)  # noqa: E731
_mlp = lambda swiglu: ds.mlp_cases(max_tp=4, max_batch=2, max_hidden=4, max_ffn=6, swiglu=swiglu,  # noqa: E731
                                   bias=None if not swiglu else False)

register(Property("tp.column.exact", _linear, column_exact,
                  "column-parallel linear == x @ W (+ b) bit for bit, any tp incl. uneven shards",
                  None, "column_parallel(x, W, tp, b=None) -> ndarray", _linear_edges))
register(Property("tp.row.exact", _linear, row_exact,
                  "row-parallel linear == x @ W + b bit for bit (bias once, after the all-reduce)",
                  None, "row_parallel(x, W, tp, b=None, *, log=None) -> ndarray", _linear_edges))
register(Property("tp.mlp.exact", lambda: _mlp(False), mlp_exact,
                  "Megatron MLP == single-device MLP bit for bit; one all-reduce per forward",
                  None, "megatron_mlp(x, W_up, W_down, tp, act='relu', b_up=None, b_down=None, *, log=None)",
                  _mlp_edges))
register(Property("tp.swiglu.bounded", lambda: _mlp(True), swiglu_bounded,
                  "TP SwiGLU within gamma_ffn |h||W_down| of the exact single-device result",
                  None, "tp_swiglu_mlp(x, W_gate, W_up, W_down, tp, *, log=None)", _swiglu_edges))
register(Property("tp.swiglu.fused", lambda: _mlp(True), swiglu_fused_bounded,
                  "fused [gate | up] SwiGLU sharded per ffn slice, within gamma_ffn |h||W_down|",
                  None, "tp_swiglu_mlp_fused(x, W_fused, W_down, tp, *, log=None)", _swiglu_edges))
register(Property("tp.layer_norm.sharded_hidden", lambda: ds.norm_cases(), layer_norm_sharded_hidden,
                  "layer norm with all-reduced statistics over a sharded hidden dim == single device, bit for bit",
                  sharded_layer_norm, "norm(x_shards: list[ndarray (batch, h_r)], eps) -> list[ndarray]", _norm_edges))
register(Property("tp.attention.bounded", lambda: ds.attention_cases(), attention_bounded,
                  "attention split by heads within gamma_{H e} |heads||Wo| of the exact result; one all-reduce",
                  None, "tp_attention(x, Wq, Wk, Wv, Wo, num_heads, num_kv_heads, tp, causal=True, *, log=None)",
                  _attention_edges))
