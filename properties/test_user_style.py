"""distcheck's strategies and property functions used the way a user certifies their own
implementation: their own @given tests, their own functions passed as ``impl=``.

The implementations below are written here, independently of distcheck's references
(no import from distcheck.parallel.dp / distcheck.parallel.tp), as a third party would write them.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcheck import strategies as ds
from distcheck.core.errors import ImplementationError, PropertyFailure
from distcheck.parallel.dp import properties as acc_props
from distcheck.parallel.dp import properties as dp_props
from distcheck.parallel.tp import properties as tp_props
from distcheck.props import run_property

FEW = settings(max_examples=25, deadline=None, database=None)


# ---- a user's data-parallel all-reduce rules


def my_weighted_allreduce(grads, sizes):
    """sum_k n_k g_k / sum_k n_k (np.average: one weighted sum, one division)."""
    return np.average(np.stack(grads), axis=0, weights=np.asarray(sizes, dtype=float))


def my_ddp_allreduce(grads, sizes):
    """What DDP does: sum the shard means, divide by the world size."""
    return np.sum(np.stack(grads), axis=0) / len(grads)


@FEW
@given(ds.dp_cases(equal_shards=False, powers_of_two=True, max_shards=4))
def test_my_weighted_allreduce_is_exact_on_unequal_shards(case):
    dp_props.unequal_shards_weighted(case, impl=my_weighted_allreduce)


@FEW
@given(ds.dp_cases(equal_shards=True, powers_of_two=True, max_shards=4))
def test_my_ddp_allreduce_is_exact_on_equal_shards(case):
    dp_props.equal_shards_bitwise(case, impl=my_ddp_allreduce)


def test_my_ddp_allreduce_is_caught_on_unequal_shards():
    result = run_property("dp.unequal_shards.weighted", "ci", impl=my_ddp_allreduce)
    assert result.verdict == "FAIL"
    assert "shard_sizes=" in result.extra["counterexample"]
    assert result.max_error > 0 and result.bound == 0.0  # bitwise regime: expected, got, error, bound
    assert "expected" in result.extra["error"] and "got" in result.extra["error"]


# ---- a user's tensor-parallel layers (they record their all-reduces in log=)


def my_row_parallel(x, W, tp, b=None, *, log=None):
    """Row-parallel linear: rank r holds rows of W (np.array_split), partials summed by one
    all-reduce (recorded in ``log``), bias once."""
    parts = [xs @ Ws for xs, Ws in zip(np.array_split(x, tp, axis=-1), np.array_split(W, tp, axis=0), strict=True)]
    out = sum(parts[1:], parts[0])
    if log is not None:
        log.append(("all_reduce", out.shape))
    return out if b is None else out + b


def my_column_parallel(x, W, tp, b=None):
    """Column-parallel linear: rank r holds columns of W (and of b), outputs concatenated."""
    bs = np.array_split(b, tp) if b is not None else [None] * tp
    outs = [x @ Ws + (0 if bk is None else bk) for Ws, bk in zip(np.array_split(W, tp, axis=1), bs, strict=True)]
    return np.concatenate(outs, axis=-1)


def my_row_parallel_naive_bias(x, W, tp, b=None, *, log=None):
    """A common bug: every rank adds the bias to its partial."""
    parts = [xs @ Ws + (0 if b is None else b)
             for xs, Ws in zip(np.array_split(x, tp, axis=-1), np.array_split(W, tp, axis=0), strict=True)]
    out = sum(parts[1:], parts[0])
    if log is not None:
        log.append(("all_reduce", np.shape(out)))
    return out


def my_row_parallel_without_log(x, W, tp, b=None):
    """The same right numbers as my_row_parallel, from a layer that cannot report its collectives."""
    return my_row_parallel(x, W, tp, b)


@FEW
@given(ds.linear_cases(max_tp=4))
def test_my_row_parallel_layer(case):
    tp_props.row_exact(case, impl=my_row_parallel)


@FEW
@given(ds.linear_cases(max_tp=4))
def test_a_layer_without_log_is_checked_on_its_numbers_only_when_asked(case):
    tp_props.row_exact(case, impl=my_row_parallel_without_log, require_log=False)


def test_a_layer_without_log_fails_the_count_claim_by_default():
    case = ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [3.0]]), tp=2)
    with pytest.raises(ImplementationError, match=r"takes no log= keyword, so its all-reduce count cannot be checked "
                                                  r"against tp.row.allreduce_count = 1") as info:
        tp_props.row_exact(case, impl=my_row_parallel_without_log)
    assert info.value.kind == "contract"
    result = run_property("tp.row.exact", "ci", impl=my_row_parallel_without_log)
    assert result.verdict == "FAIL" and result.extra["failure_kind"] == "contract"
    assert result.extra["found_by"] == "edge case 1 of 3"  # any case fails it: the first one tried
    relaxed = run_property("tp.row.exact", "ci", impl=my_row_parallel_without_log, options={"require_log": False})
    assert relaxed.verdict == "pass", relaxed.detail


def test_a_layer_that_takes_log_but_records_nothing_fails():
    def silent(x, W, tp, b=None, *, log=None):
        return my_row_parallel(x, W, tp, b)

    case = ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [3.0]]), tp=2)
    with pytest.raises(PropertyFailure, match=r"row_parallel \(tp=2\): 0 all-reduces per forward \(the implementation "
                                              r"takes log= but recorded no all-reduce\)") as info:
        tp_props.row_exact(case, impl=silent)
    assert info.value.kind == "claim" and (info.value.expected, info.value.got) == (1, 0)
    # at tp = 1 the all-reduce is a no-op: recording none is right
    tp_props.row_exact(ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [3.0]]), tp=1), impl=silent)


def test_two_all_reduces_fail_the_count():
    def twice(x, W, tp, b=None, *, log=None):
        out = my_row_parallel(x, W, tp, b, log=log)
        log.append(("all_reduce", out.shape))
        return out

    case = ds.LinearCase(x=np.array([[1.0, 2.0]]), W=np.array([[1.0], [3.0]]), tp=1)
    with pytest.raises(PropertyFailure, match="2 all-reduces per forward"):
        tp_props.row_exact(case, impl=twice)


@FEW
@given(ds.linear_cases(max_tp=4, divisible=False))
def test_my_column_parallel_layer_on_uneven_shards(case):
    tp_props.column_exact(case, impl=my_column_parallel)


def test_my_naive_bias_is_caught_with_a_small_counterexample():
    result = run_property("tp.row.exact", "ci", impl=my_row_parallel_naive_bias)
    assert result.verdict == "FAIL"
    assert result.extra["counterexample"].startswith("LinearCase(tp=2")
    assert "b=" in result.extra["counterexample"]
    assert "impl=" in result.extra["reproduce"]  # the replay names the implementation


def test_a_crashing_implementation_fails_the_property():
    def needs_divisible_tp(x, W, tp, b=None):
        return sum(np.split(x, tp, axis=-1)[r] @ np.split(W, tp, axis=0)[r] for r in range(tp))

    with pytest.raises(ImplementationError, match="implementation row_parallel raised ValueError") as info:
        tp_props.row_exact(ds.LinearCase(x=np.ones((1, 3)), W=np.ones((3, 2)), tp=2), impl=needs_divisible_tp)
    assert isinstance(info.value, PropertyFailure) and info.value.kind == "raised"


def test_a_crash_fails_the_property_and_says_the_implementation_raised():
    def raises(x, W, tp, b=None, *, log=None):
        if b is not None:
            raise ZeroDivisionError("bias scale is zero")
        return my_row_parallel(x, W, tp, b, log=log)

    crash = run_property("tp.row.exact", "ci", impl=raises)
    assert crash.verdict == "FAIL" and crash.extra["failure_kind"] == "raised"
    assert crash.detail.startswith("implementation row_parallel raised ZeroDivisionError: bias scale is zero; "
                                   "counterexample LinearCase(tp=2, x=[[1.0, 2.0, 3.0]]")  # the first edge case
    # a wrong value reads differently: the property's claim, with max error and bound
    wrong = run_property("tp.row.exact", "ci", impl=my_row_parallel_naive_bias)
    assert wrong.extra["failure_kind"] == "claim"
    assert wrong.detail.startswith("PropertyFailure: row-parallel (tp=2) vs x @ W + b: not bitwise equal; max error")


# ---- a user's gradient accumulation


def my_accumulate(grad_fn_sum, params, X, y, microbatch_sizes, mask=None):
    """Sum the micro-batch gradient sums, divide once by the number of valid tokens (or examples)."""
    total, lo = None, 0
    for size in microbatch_sizes:
        hi = lo + size
        args = (params, X[lo:hi], y[lo:hi]) + (() if mask is None else (mask[lo:hi],))
        g = grad_fn_sum(*args)
        total = g if total is None else total + g
        lo = hi
    count = X.shape[0] if mask is None else np.sum(mask)
    return total / count


@FEW
@given(ds.accumulation_cases(max_sequences=5))
def test_my_accumulation_is_split_invariant(case):
    acc_props.tokens_split_invariant(case, impl=my_accumulate)
    acc_props.examples_split_invariant(case, impl=my_accumulate)


# ---- strategies compose with the user's own strategies


@FEW
@given(ds.parallel_configs(max_world_size=64), st.integers(0, 63))
def test_my_rank_to_coords(cfg, rank):
    # the user's own (tp innermost) coordinate map, checked against distcheck's layout
    from distcheck.parallel.layout import coords

    rank %= cfg.world_size
    mine = {"tp": rank % cfg.tp, "cp": rank // cfg.tp % cfg.cp,
            "pp": rank // (cfg.tp * cfg.cp) % cfg.pp, "dp": rank // (cfg.tp * cfg.cp * cfg.pp)}
    theirs = coords(cfg, rank)
    assert {a: theirs[a] for a in mine} == mine
