"""distcheck.strategies: bad arguments raise InvalidArgument, defaults generate, reprs read well."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck import strategies as ds
from distcheck.core.errors import ConfigError
from distcheck.core.exactness import max_exact_int

BAD = [
    (ds.shard_counts, dict(min_shards=3, max_shards=2), "Cannot have max_shards=2 < min_shards=3"),
    (ds.shard_counts, dict(min_shards=0), "min_shards=0 must be at least 1"),
    (ds.shard_counts, dict(max_shards=2.5), "max_shards=2.5 must be an integer"),
    (ds.shard_counts, dict(max_shards=True), "must be an integer"),
    (ds.shard_sizes, dict(min_size=4, max_size=3), "Cannot have max_size=3 < min_size=4"),
    (ds.shard_sizes, dict(equal=False, max_shards=1), "equal=False needs max_shards >= 2"),
    (ds.shard_sizes, dict(equal=False, min_size=3, max_size=3), "two different sizes"),
    (ds.shard_sizes, dict(powers_of_two=True, min_size=5, max_size=7), "no power of two"),
    (ds.shard_sizes, dict(equal="yes"), "equal='yes' must be True, False or None"),
    (ds.float_dtypes, dict(allowed=("float64", "int8")), "'int8'"),
    (ds.float_dtypes, dict(allowed=()), "must not be empty"),
    (ds.integer_valued_arrays, dict(shape=(2, -1)), "shape[1]=-1"),
    (ds.integer_valued_arrays, dict(shape=3, dtype="float16", max_magnitude=2**11 + 1), "exceeds 2**11"),
    (ds.integer_valued_arrays, dict(shape=3, dtype="int32"), "dtype='int32'"),
    (ds.dp_cases, dict(min_features=2, max_features=1), "Cannot have max_features=1 < min_features=2"),
    (ds.accumulation_cases, dict(min_seq_len=5, max_seq_len=4), "Cannot have max_seq_len=4 < min_seq_len=5"),
    (ds.linear_cases, dict(min_tp=2, max_tp=1), "Cannot have max_tp=1 < min_tp=2"),
    (ds.mlp_cases, dict(min_ffn=9, max_ffn=8), "Cannot have max_ffn=8 < min_ffn=9"),
    (ds.mlp_cases, dict(swiglu=1), "swiglu=1 must be True, False or None"),
    (ds.mlp_cases, dict(divisible="yes"), "divisible='yes' must be True, False or None"),
    (ds.linear_cases, dict(max_magnitude=-1), "max_magnitude=-1 must be at least 0"),
    (ds.mlp_cases, dict(max_magnitude=1.5), "max_magnitude=1.5 must be an integer"),
    (ds.norm_cases, dict(min_batch=0), "min_batch=0 must be at least 1"),
    (ds.attention_cases, dict(min_tp=5, max_tp=5, max_kv_heads=4), "no tp in [min_tp=5, max_tp=5]"),
    (ds.parallel_configs, dict(min_tp=2, max_tp=1), "Cannot have max_tp=1 < min_tp=2"),
    (ds.parallel_configs, dict(min_tp=4, min_pp=4, max_world_size=8),
     "Cannot have max_world_size=8 < min_tp*min_cp*min_pp*min_dp"),
    (ds.parallel_configs, dict(max_ep=0), "max_ep=0 must be at least 1"),
    (ds.pipeline_params, dict(schedules=("zb1p",)), "'zb1p'"),
    (ds.pipeline_params, dict(min_v=1), "min_v=1 must be at least 2"),
    (ds.pipeline_params, dict(min_stages=9, max_stages=8), "Cannot have max_stages=8 < min_stages=9"),
    (ds.pipeline_params,
     dict(schedules="interleaved", min_stages=5, max_stages=5, min_microbatches=1, max_microbatches=4),
     "m to be a multiple of p"),
    (ds.transformer_configs, dict(gqa=True, max_group=1), "gqa=True needs max_group >= 2"),
    (ds.transformer_configs, dict(min_vocab=10, max_vocab=9), "Cannot have max_vocab=9 < min_vocab=10"),
    (ds.zero_cases, dict(min_dp=2, max_dp=1), "Cannot have max_dp=1 < min_dp=2"),
    (ds.zero_cases, dict(ks=()), "must not be empty"),
    (ds.collective_cases, dict(collectives=("all_reduce", "gossip")), "'gossip'"),
    (ds.collective_cases, dict(min_elements=-1), "min_elements=-1 must be at least 0"),
    (ds.shard_counts, dict(unknown=1), "unexpected keyword"),
]


@pytest.mark.parametrize("factory, kwargs, message", BAD, ids=[f"{f.__name__}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_bad_arguments_raise_invalid_argument_eagerly(factory, kwargs, message):
    with pytest.raises(InvalidArgument) as e:
        factory(**kwargs)
    assert message in str(e.value)
    assert isinstance(e.value, TypeError)  # Hypothesis' InvalidArgument is a TypeError


def test_positional_arguments_are_rejected():
    with pytest.raises(InvalidArgument):
        ds.shard_counts(1, 2)


FACTORIES = [getattr(ds, n) for n in ds.__all__ if callable(getattr(ds, n)) and not isinstance(getattr(ds, n), type)]


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.__name__)
def test_defaults_generate(factory):
    strategy = factory(shape=(2, 3)) if factory is ds.integer_valued_arrays else factory()
    seen = []

    @settings(max_examples=15, database=None, deadline=None)
    @given(strategy)
    def collect(x):
        seen.append(x)

    collect()
    assert seen


def test_reprs_show_the_call():
    assert repr(ds.shard_counts()) == "shard_counts()"
    assert repr(ds.shard_sizes(max_shards=4)) == "shard_sizes(max_shards=4)"
    assert repr(ds.parallel_configs(max_tp=2, any_order=True)) == "parallel_configs(max_tp=2, any_order=True)"
    assert "pipeline_params(schedules=('gpipe',))" == repr(ds.pipeline_params(schedules=("gpipe",)))


def test_all_is_explicit_and_complete():
    public = {n for n, v in vars(ds).items() if not n.startswith("_") and getattr(v, "__module__", None) == ds.__name__}
    assert public == set(ds.__all__)


@settings(max_examples=40, database=None, deadline=None)
@given(ds.shard_sizes(equal=False, powers_of_two=True, max_size=8))
def test_unequal_power_of_two_shards(sizes):
    assert len(set(sizes)) > 1
    assert all(s & (s - 1) == 0 for s in sizes)


@settings(max_examples=40, database=None, deadline=None)
@given(ds.pipeline_params())
def test_pipeline_params_respect_schedule_constraints(pp):
    from distcheck.parallel.pp import simulate

    if pp.schedule == "interleaved":
        assert pp.v >= 2 and pp.m % pp.p == 0
    else:
        assert pp.v == 1
    simulate(**pp.as_kwargs())  # never raises ConfigError


@settings(max_examples=60, database=None, deadline=None)
@given(ds.invalid_parallel_configs())
def test_invalid_parallel_configs_are_rejected_naming_the_field(bad):
    from distcheck.parallel.layout import ParallelConfig

    with pytest.raises(ConfigError) as e:
        ParallelConfig(**bad.kwargs)
    assert e.value.field == bad.field


@settings(max_examples=40, database=None, deadline=None)
@given(ds.parallel_configs(max_world_size=32, min_dp=2))
def test_parallel_configs_respect_bounds(cfg):
    assert cfg.world_size <= 32 and cfg.dp >= 2


@settings(max_examples=30, database=None, deadline=None)
@given(ds.transformer_configs(gqa=True, tied=True, swiglu=False))
def test_transformer_config_options_are_forced(cfg):
    assert cfg.num_kv_heads < cfg.num_heads and cfg.tied_embeddings and not cfg.swiglu


@settings(max_examples=30, database=None, deadline=None)
@given(ds.dp_cases())
def test_dp_case_magnitudes_keep_sums_exact(case):
    n, f = case.X.shape
    bound = max_exact_int(2 * n * (f + 1) * len(case.shard_sizes) * max(case.shard_sizes), factors=3)
    for a in (case.X, case.y, case.w):
        assert np.all(np.abs(a) <= bound) and np.all(a == np.round(a))


@settings(max_examples=30, database=None, deadline=None)
@given(ds.linear_cases(max_tp=5, divisible=True))
def test_linear_cases_divisible(case):
    assert case.W.shape[0] % case.tp == 0 and case.W.shape[1] % case.tp == 0


@settings(max_examples=30, database=None, deadline=None)
@given(ds.linear_cases(max_tp=4, bias=True, max_magnitude=3), ds.mlp_cases(max_tp=4, divisible=True, bias=True,
                                                                            max_magnitude=1))
def test_magnitude_caps_and_divisible_mlp(lin, mlp):
    # the cap narrows the values (e.g. to keep sums exact in bfloat16) and nothing else
    assert all(np.all(np.abs(a) <= 3) for a in (lin.x, lin.W, lin.b))
    assert all(np.all(np.abs(a) <= 1) for a in (mlp.x, mlp.W_up, mlp.W_down, mlp.b_down))
    assert mlp.W_up.shape[1] % mlp.tp == 0


@settings(max_examples=30, database=None, deadline=None)
@given(st.data())
def test_strategies_compose_in_user_tests(data):
    cfg = data.draw(ds.parallel_configs(max_world_size=16))
    assert cfg.world_size == cfg.tp * cfg.cp * cfg.pp * cfg.dp


@settings(max_examples=30, database=None, deadline=None)
@given(ds.mlp_cases(max_tp=3, max_hidden=5, max_ffn=7, swiglu=None, bias=True))
def test_mlp_case_shapes_agree(case):
    # values are drawn at the largest shape and sliced: the slices must line up
    b, h = case.x.shape
    f = case.W_up.shape[1]
    assert case.W_up.shape == (h, f) and case.W_down.shape == (f, h) and case.b_down.shape == (h,)
    assert case.W_gate is None or case.W_gate.shape == (h, f)
    assert 1 <= b <= 3 and 1 <= h <= 5 and case.tp <= f <= 7
    assert case.x.flags.c_contiguous and case.W_up.flags.c_contiguous


@settings(max_examples=30, database=None, deadline=None)
@given(ds.attention_cases())
def test_attention_case_shapes_agree(case):
    e, H, G = case.head_dim, case.num_heads, case.num_kv_heads
    s, h = case.x.shape
    assert case.Wq.shape == (h, H * e) and case.Wk.shape == (h, G * e) == case.Wv.shape
    assert case.Wo.shape == (H * e, h) and G % case.tp == 0 and H % G == 0


@settings(max_examples=30, database=None, deadline=None)
@given(ds.accumulation_cases())
def test_accumulation_case_masks_and_splits(case):
    b, s, f = case.X.shape
    assert case.y.shape == case.mask.shape == (b, s) and case.w.shape == (f,)
    assert set(np.unique(case.mask)) <= {0.0, 1.0} and case.mask.sum(axis=1).min() >= 1
    assert sum(case.split_a) == sum(case.split_b) == b


def test_shrinking_reaches_the_smallest_failing_shape():
    # a user's check that fails whenever in_features is not a multiple of tp: the shrunk
    # counterexample is the smallest such case, with all-zero values
    from hypothesis import find

    case = find(ds.linear_cases(bias=False), lambda c: c.W.shape[0] % c.tp != 0,
                settings=settings(database=None, derandomize=True))
    assert (case.tp, case.W.shape) == (2, (3, 2))
    assert not case.x.any() and not case.W.any()


def test_integer_valued_arrays_exact_and_in_range():
    from hypothesis import find

    arr = find(ds.integer_valued_arrays(shape=(2, 3), dtype="float32", max_magnitude=5), lambda a: a.min() <= -5,
               settings=settings(database=None, derandomize=True))
    assert arr.dtype == np.float32 and arr.shape == (2, 3) and arr.min() == -5
