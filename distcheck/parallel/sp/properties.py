"""Sequence-parallel properties: the MLP and attention blocks against the single-device block, the
layer norm's parameter gradients, the bytes each rank sends and the activation bytes saved.

Exactness regimes (:mod:`distcheck.core.exactness`):

- ``sp.mlp.exact`` and ``sp.layer_norm.param_grads``: the strategies draw tokens whose layer norm is
  exact (:func:`distcheck.strategies.exact_norm_rows`), so every value is a small integer and the
  results are equal bit for bit;
- ``sp.attention.bounded``: the softmax is not exact. Both paths compute each head on the same
  operands (the all-gathered layer norm output is the single-device one, bit for bit), so what
  differs is the order of the final sum over heads plus the residual: against the exact sum, any
  order of those ``H e + 1`` terms is within ``gamma_{H e + 1} (|heads| |Wo| + |x|)`` (Higham,
  "Accuracy and Stability of Numerical Algorithms", eq. 3.5);
- ``sp.comm.bytes`` and ``sp.activations.saved``: integers and exact fractions.

Implementation slots (``impl``) have the signatures of :mod:`distcheck.parallel.sp.reference`, listed
per property. The block properties require the collective log: the implementation takes ``log=`` (a
list) and appends ``("all_gather", shape)`` and ``("reduce_scatter", shape)`` per collective; one forward
must record exactly ``sp.block.all_gathers_per_forward`` all-gathers and
``sp.block.reduce_scatters_per_forward`` reduce-scatters, and no all-reduce (at tp = 1, none at all is
also right). ``require_log=False`` checks the numbers only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from distcheck.core.errors import ImplementationError, PropertyFailure
from distcheck.core.exactness import assert_bitwise_equal, assert_within, gamma, to_exact
from distcheck.core.vocab import Collective
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.sp import strategies as ds

if TYPE_CHECKING:
    from distcheck.parallel.comm.reference import CommResult

__all__ = ["mlp_exact", "attention_bounded", "layer_norm_param_grads", "comm_bytes", "activations_saved",
           "sp_collectives"]


def _ref(name: str) -> Callable[..., Any]:
    from distcheck.parallel.sp import reference

    return getattr(reference, name)


def _call_logged(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list | None]:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
        takes_log = any(p.name == "log" or p.kind is p.VAR_KEYWORD for p in params)
    except (TypeError, ValueError):
        takes_log = False
    if not takes_log:
        return call_impl(what, fn, *args, **kwargs), None
    log: list = []
    return call_impl(what, fn, *args, log=log, **kwargs), log


def _check_block_log(log: list | None, tp: int, what: str, require_log: bool) -> None:
    """One forward's log must hold the closed forms' all-gathers and reduce-scatters and no all-reduce."""
    expected = {Collective.ALL_GATHER: int(form_value("sp.block.all_gathers_per_forward")),
                Collective.REDUCE_SCATTER: int(form_value("sp.block.reduce_scatters_per_forward")),
                Collective.ALL_REDUCE: 0}
    if log is None:
        if require_log:
            raise ImplementationError(
                f"implementation {what} takes no log= keyword, so its collectives cannot be checked against "
                "sp.block.all_gathers_per_forward and sp.block.reduce_scatters_per_forward; append "
                "('all_gather', shape) and ('reduce_scatter', shape) to log, or pass require_log=False", "contract")
        return
    counts = Counter(e[0] for e in log if isinstance(e, tuple) and e)
    got = {c: counts.get(c, 0) for c in expected}
    if got == expected or (tp == 1 and not any(got.values())):
        return
    raise PropertyFailure(f"{what} (tp={tp}): collectives per forward {dict(got)}, the closed forms say "
                          f"{dict(expected)}", expected=expected, got=got)


def _shards(x: ArrayLike, tp: int) -> list[np.ndarray]:
    return _ref("sequence_shards")(x, tp)


def mlp_exact(case: ds.SPBlockCase, *, impl: Callable[..., Sequence[ArrayLike]] | None = None,
              require_log: bool = True) -> None:
    """The sequence-parallel MLP block, concatenated over the ranks == the single-device block, bit for
    bit; one all-gather and one reduce-scatter per forward (see the module doc)."""
    impl = impl or _ref("sp_mlp_block")
    got, log = _call_logged("sp_mlp_block", impl, _shards(case.x, case.tp), case.ln_weight, case.ln_bias,
                            case.W_up, case.W_down, case.b_down, keep=case.keep, p=case.p)
    expected = _ref("mlp_block")(case.x, case.ln_weight, case.ln_bias, case.W_up, case.W_down, case.b_down,
                                 keep=case.keep, p=case.p)
    _check_shards("sp_mlp_block", got, case.tp)
    assert_bitwise_equal(expected, np.concatenate(got, axis=0),
                         what=f"sequence-parallel MLP block (tp={case.tp}) vs single device")
    _check_block_log(log, case.tp, "sp_mlp_block", require_log)


def _check_shards(what: str, got: object, tp: int) -> None:
    if not isinstance(got, (list, tuple)) or len(got) != tp:
        raise PropertyFailure(f"{what} must return one output shard per rank (tp={tp})", expected=tp,
                              got=type(got).__name__ if not isinstance(got, (list, tuple)) else len(got))


def attention_bounded(case: ds.SPAttentionCase, *, impl: Callable[..., Sequence[ArrayLike]] | None = None,
                      require_log: bool = True) -> None:
    """The sequence-parallel attention block within gamma_{H e + 1} (|heads||Wo| + |x|) of the exact
    single-device result; one all-gather and one reduce-scatter per forward."""
    from distcheck.parallel.tp.heads import attention_heads

    impl = impl or _ref("sp_attention_block")
    got, log = _call_logged("sp_attention_block", impl, _shards(case.x, case.tp), case.ln_weight, case.ln_bias,
                            case.Wq, case.Wk, case.Wv, case.Wo, case.num_heads, case.num_kv_heads)
    _check_shards("sp_attention_block", got, case.tp)
    normed = _ref("layer_norm")(case.x, case.ln_weight, case.ln_bias)
    heads = attention_heads(normed, case.Wq, case.Wk, case.Wv, case.num_heads, case.num_kv_heads, True)
    expected = to_exact(heads) @ to_exact(case.Wo) + to_exact(case.x)
    magnitude = to_exact(np.abs(heads)) @ to_exact(np.abs(case.Wo)) + to_exact(np.abs(case.x))
    bound = gamma(case.Wo.shape[0] + 1) * magnitude
    assert_within(expected, np.concatenate(got, axis=0), bound,
                  what=f"sequence-parallel attention block (tp={case.tp})")
    _check_block_log(log, case.tp, "sp_attention_block", require_log)


def layer_norm_param_grads(case: ds.SPNormGradCase, *, impl: Callable[..., tuple[ArrayLike, ArrayLike]] | None = None,
                           require_log: bool = True) -> None:
    """The layer norm's weight and bias gradients summed over the sequence shards == the single-device
    gradients, bit for bit; one all-reduce per parameter at tp >= 2."""
    impl = impl or _ref("sp_layer_norm_param_grads")
    got, log = _call_logged("sp_layer_norm_param_grads", impl, _shards(case.x, case.tp), _shards(case.dy, case.tp))
    dw, db = _ref("layer_norm_param_grads")(case.x, case.dy)
    if not isinstance(got, tuple) or len(got) != 2:
        raise PropertyFailure("sp_layer_norm_param_grads must return (dweight, dbias)", expected=2, got=got)
    assert_bitwise_equal(dw, got[0], what=f"layer norm weight gradient over tp={case.tp} sequence shards")
    assert_bitwise_equal(db, got[1], what=f"layer norm bias gradient over tp={case.tp} sequence shards")
    if log is None:
        if require_log:
            raise ImplementationError("implementation sp_layer_norm_param_grads takes no log= keyword, so its "
                                      "all-reduces cannot be checked", "contract")
        return
    count = sum(1 for e in log if isinstance(e, tuple) and e and e[0] == Collective.ALL_REDUCE)
    if case.tp >= 2 and count != 2:
        raise PropertyFailure(f"layer norm gradients over tp={case.tp} shards: {count} all-reduces, expected one "
                              "per parameter (weight, bias)", expected=2, got=count)


def sp_collectives(inputs: Sequence[np.ndarray]) -> tuple[CommResult, CommResult]:
    """Reference slot of ``sp.comm.bytes``: a ring reduce-scatter of the ranks' inputs, then a ring
    all-gather of the shards it leaves; ``(reduce-scatter CommResult, all-gather CommResult)``."""
    from distcheck.parallel.comm.reference import ring_all_gather, ring_reduce_scatter

    rs = ring_reduce_scatter(inputs)
    return rs, ring_all_gather(list(rs.outputs))


def comm_bytes(case: tuple[int, int], *,
               impl: Callable[[Sequence[np.ndarray]], tuple[CommResult, CommResult]] = sp_collectives) -> None:
    """A ring reduce-scatter then a ring all-gather of a block's S-byte output send what a ring all-reduce
    of it sends: the same per-rank volumes (as a multiset: with uneven chunks the ring all-reduce's
    phases hand the larger chunk to other ranks), each equal to sp.block.bytes_per_rank when t divides
    the elements (simulated with :mod:`distcheck.parallel.comm`). ``impl(inputs) -> (rs, ag)`` gives the two
    collectives' results (:func:`sp_collectives`)."""
    from distcheck.parallel.comm.reference import ring_all_reduce

    t, elements = case
    rng = np.random.default_rng(t * 1000 + elements)
    inputs = [rng.integers(-8, 9, size=elements).astype(np.float64) for _ in range(t)]
    rs, ag = call_impl("sp_collectives", impl, inputs)
    ar = ring_all_reduce(inputs)
    sp_sent = [a + b for a, b in zip(rs.sent_bytes, ag.sent_bytes, strict=True)]
    if sorted(sp_sent) != sorted(ar.sent_bytes):
        raise PropertyFailure(f"bytes per rank, reduce-scatter + all-gather vs all-reduce (t={t}, {elements} "
                              "elements)", expected=list(ar.sent_bytes), got=sp_sent)
    if elements % t == 0:
        form = form_value("sp.block.bytes_per_rank", size_bytes=8 * elements, t=t)
        if any(Fraction(b) != form for b in sp_sent):
            raise PropertyFailure(f"bytes per rank vs sp.block.bytes_per_rank (t={t}, S={8 * elements})",
                                  expected=form, got=sp_sent)


def _bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, *, sequence_parallel: bool = False) -> int | Fraction:
    from distcheck.parallel.activations.reference import bytes_per_layer

    return bytes_per_layer(s, b, h, a, t, sequence_parallel=sequence_parallel)


def activations_saved(case: tuple[int, int, int, int, int], *,
                      impl: Callable[..., int | Fraction] = _bytes_per_layer) -> None:
    """The activation bytes per layer that the stored-tensor reference (``impl``, the slot
    ``bytes_per_layer(s, b, h, a, t, *, sequence_parallel)``) counts with and without sequence
    parallelism differ by sp.activations.bytes_saved_per_layer, exactly."""
    s, b, h, a, t = case
    saved = (Fraction(call_impl("bytes_per_layer", impl, s, b, h, a, t))
             - Fraction(call_impl("bytes_per_layer", impl, s, b, h, a, t, sequence_parallel=True)))
    form = form_value("sp.activations.bytes_saved_per_layer", s=s, b=b, h=h, t=t)
    if saved != form:
        raise PropertyFailure(f"activation bytes saved per layer (s={s}, b={b}, h={h}, a={a}, t={t})",
                              expected=form, got=saved)


def _a(rows: ArrayLike) -> np.ndarray:
    return np.array(rows, dtype=float)


def _mlp_edges() -> tuple[ds.SPBlockCase, ...]:
    """tp = 2 over 3 tokens (uneven shards) and ffn = 3, tokens of different means and scales, a bias,
    and a dropout mask that differs between the shards."""
    x = _a([[1, -1, 1, -1], [2, 4, 4, 2], [-3, -3, -1, -1]])  # m + c z with (m, c) = (0, 1), (3, 1), (-2, 1)
    return (ds.SPBlockCase(x=x, tp=2, ln_weight=_a([1, 2, 1, 1]), ln_bias=_a([0, 1, 0, -1]),
                           W_up=_a([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]]),
                           W_down=_a([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]]), b_down=_a([1, 0, 0, 1]),
                           keep=np.array([[1, 1, 0, 1], [0, 1, 1, 1], [0, 1, 1, 1]], dtype=bool)),)


def _attention_edges() -> tuple[ds.SPAttentionCase, ...]:
    """GQA over tp = 2: 4 query heads over 2 kv heads (one kv head and two query heads per rank), 3 tokens
    in uneven shards."""
    x = _a([[1, -1], [2, 0], [-1, 1]])
    return (ds.SPAttentionCase(x=x, tp=2, ln_weight=_a([1, 2]), ln_bias=_a([0, 1]),
                               Wq=_a([[1, 0, 1, -1], [0, 1, 1, 0]]), Wk=_a([[1, 0], [1, 1]]), Wv=_a([[1, 2], [0, 1]]),
                               Wo=_a([[1, 0], [0, 1], [1, 1], [2, 0]]), num_heads=4, num_kv_heads=2),)


def _grad_edges() -> tuple[ds.SPNormGradCase, ...]:
    """tp = 2 over 3 tokens: the second shard's tokens carry gradient the first never sees."""
    return (ds.SPNormGradCase(x=_a([[1, -1], [3, 1], [0, 2]]), dy=_a([[1, 2], [0, -1], [3, 1]]), tp=2),)


_sizes = lambda: st.tuples(st.integers(1, 8), st.integers(1, 40))  # noqa: E731
_shapes = lambda: st.tuples(*(st.integers(1, 64) for _ in range(5)))  # noqa: E731


def _comm_edges() -> tuple[tuple[int, int], ...]:
    """(t, elements): one rank (nothing sent); t dividing the elements (the closed form applies); uneven
    chunks (3 ranks, 7 elements: the phases hand the larger chunk to different ranks); more ranks than
    elements (empty chunks); the largest t and size the strategy draws."""
    return ((1, 1), (2, 4), (4, 8), (3, 5), (3, 7), (8, 3), (8, 40))


def _shape_edges() -> tuple[tuple[int, int, int, int, int], ...]:
    """(s, b, h, a, t): all ones (t = 1: nothing saved); t dividing none of s, h and a (fractional bytes per
    rank); one head over several ranks; the largest shape the strategy draws."""
    return ((1, 1, 1, 1, 1), (2, 1, 4, 2, 1), (2, 1, 4, 2, 2), (4, 2, 2, 1, 3), (5, 3, 7, 3, 2), (4, 2, 8, 1, 4),
            (64, 64, 64, 64, 64))


register(Property("sp.mlp.exact", lambda: ds.sp_mlp_block_cases(), mlp_exact,
                  "sequence-parallel MLP block == single-device block bit for bit; one all-gather and one "
                  "reduce-scatter per forward, no all-reduce",
                  None, "sp_mlp_block(x_shards, ln_weight, ln_bias, W_up, W_down, b_down=None, *, keep=None, p=0.5, "
                  "eps=0.0, log=None) -> list[ndarray]", _mlp_edges))
register(Property("sp.attention.bounded", lambda: ds.sp_attention_block_cases(), attention_bounded,
                  "sequence-parallel attention block within gamma_{He+1} (|heads||Wo| + |x|) of the exact "
                  "single-device block; one all-gather and one reduce-scatter per forward",
                  None, "sp_attention_block(x_shards, ln_weight, ln_bias, Wq, Wk, Wv, Wo, num_heads, num_kv_heads, *, "
                  "causal=True, eps=0.0, log=None) -> list[ndarray]", _attention_edges))
register(Property("sp.layer_norm.param_grads", lambda: ds.sp_norm_grad_cases(), layer_norm_param_grads,
                  "layer norm weight and bias gradients summed over the sequence shards == single device, bit for "
                  "bit; one all-reduce per parameter",
                  None, "sp_layer_norm_param_grads(x_shards, dy_shards, eps=0.0, *, log=None) -> (dweight, dbias)",
                  _grad_edges))
register(Property("sp.comm.bytes", _sizes, comm_bytes,
                  "ring reduce-scatter + all-gather send the per-rank volumes of a ring all-reduce "
                  "(= sp.block.bytes_per_rank when t divides S); exact",
                  sp_collectives, "sp_collectives(inputs: list[ndarray]) -> (reduce-scatter CommResult, "
                  "all-gather CommResult)", _comm_edges))
register(Property("sp.activations.saved", _shapes, activations_saved,
                  "stored activation bytes per layer, TP minus TP+SP == sp.activations.bytes_saved_per_layer; exact",
                  _bytes_per_layer, "bytes_per_layer(s, b, h, a, t=1, *, sequence_parallel=False) -> int | Fraction",
                  _shape_edges))
