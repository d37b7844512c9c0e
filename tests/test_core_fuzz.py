"""Junk in, ConfigError out: every public entry point of the numpy references answers random
arguments with a result or a ConfigError, never another exception (AttributeError, TypeError,
IndexError, ZeroDivisionError, MemoryError, numpy errors) and never a hang.

(For :mod:`distcheck.strategies` the refusal is Hypothesis' InvalidArgument, raised when
the strategy is built.) The junk mixes wrong types (None, strings, dicts, objects, configs of the wrong class),
NaN/infinity, empty and ragged arrays, negative and huge integers (2**40, 10**12: sizes that
must be refused by the documented limits, not enumerated) and valid values, so a call gets
past the first check often enough to reach the later ones. Valid sizes stay small (<= 12),
so a call that is accepted finishes quickly; the deadline catches one that does not.
"""

from __future__ import annotations

import inspect
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.extra import numpy as hnp

from distcheck import strategies
from distcheck.core import exactness
from distcheck.core.errors import ConfigError, PropertyFailure
from distcheck.parallel import activations, comm, dp, layout, memory, params, tp, zero
from distcheck.parallel import pp as pipeline
from distcheck.parallel.layout import ParallelConfig
from distcheck.parallel.params import PRESETS
from distcheck.parallel.pp import Action

#: result containers (no validation of their own) and type aliases are not entry points
_NOT_ENTRY_POINTS = {"Schedule", "Span", "Timeline", "CommResult", "RankBytes", "ZeroPartition",
                     "AccumulationResult", "StoredTensor", "BytesPerParam", "DeadlockError"}

_WORDS = ["gpipe", "1f1b", "interleaved", "relu", "gelu", "silu", "flat", "fsdp2", "zero_redundancy",
          "all_reduce", "all_gather", "broadcast", "mixed_adamw", "tp", "dp", "pp", "ep", "none", "full",
          "selective", "examples", "tokens", "plain", "sum", "mean", "80 GB", "float32", "shard", "tp-cp-pp-dp"]

_small_float = st.floats(-8, 8, allow_nan=False, width=64)
_arrays = st.one_of(
    hnp.arrays(st.sampled_from([np.float64, np.int64]),
               hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3), elements=st.integers(-4, 4)),
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=3),
               elements=st.one_of(_small_float, st.sampled_from([np.nan, np.inf, -np.inf]))),
    hnp.arrays(np.bool_, hnp.array_shapes(max_dims=2, max_side=3)),
    st.just(np.array(["a", "b"])),
    st.just(np.array([1 + 2j])),
    st.just(np.array([object(), 1], dtype=object)),
)
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([2**40, 10**12, -(2**40)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_WORDS), st.text(max_size=3),
    st.fractions(min_value=-4, max_value=4, max_denominator=5),
)
_configs = st.sampled_from([
    ParallelConfig(tp=2, dp=2), ParallelConfig(tp=8, pp=10**6, dp=10**6), ParallelConfig(tp=2, cp=2, ep=2),
    PRESETS["llama-3.2-1b"], np.random.default_rng(0), dp.mse_grad, dp.mse_grad_sum, object(),
    {0: [Action("F", 0, 0), Action("B", 0, 0)]}, [[Action("F", 0, 0)]],
])
JUNK = st.deferred(lambda: st.one_of(
    _scalars, _arrays, _configs,
    st.lists(st.integers(-2, 8), max_size=4),
    st.lists(_arrays, min_size=1, max_size=3),
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=2), max_size=3),
    st.dictionaries(st.sampled_from(["W1", "b1", "W2", "b2", "a", 0]), _arrays, max_size=4),
    st.tuples(st.integers(-1, 5), st.integers(-1, 5)),
))

MODULES = [dp, tp, pipeline, memory, zero, activations, params, layout, comm, exactness, strategies]
#: beyond ConfigError, the outcomes that are answers, not crashes
ALLOWED = {
    "exactness": (PropertyFailure,),  # the assert_* helpers fail this way; non-finite values too
    "pp": (pipeline.DeadlockError,),  # a junk order that can never finish is a deadlock, by contract
    "strategies": (InvalidArgument,),  # Hypothesis' convention for a bad strategy argument (validated eagerly)
}


def _entry_points(module):
    out = []
    for name in module.__all__:
        obj = getattr(module, name)
        if name in _NOT_ENTRY_POINTS or not callable(obj):
            continue
        out.append((name, obj))
    return out


def _call(fn, data):
    sig = inspect.signature(fn)
    args, kwargs = [], {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if p.kind is p.VAR_KEYWORD and data.draw(st.booleans()):  # rank_of(cfg, **index)
                kwargs[data.draw(st.sampled_from(["tp", "dp", "pp", "cp", "ep", "x"]))] = data.draw(JUNK)
            continue
        if p.default is not p.empty and data.draw(st.booleans()):
            continue  # leave a defaulted argument out
        value = data.draw(JUNK, label=p.name)
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        elif kwargs:  # a positional after a skipped default: pass it by name
            kwargs[p.name] = value
        else:
            args.append(value)
    return fn(*args, **kwargs)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # e.g. "Mean of empty slice": NaN must be a ConfigError instead
@pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@settings(max_examples=100, deadline=timedelta(seconds=10), database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_junk_gives_a_result_or_config_error(module, data):
    name, fn = data.draw(st.sampled_from(_entry_points(module)), label="function")
    allowed = (ConfigError,) + ALLOWED.get(module.__name__.rsplit(".", 1)[-1], ())
    try:
        with np.errstate(all="ignore"):  # valid junk may overflow a float: that is an answer (inf), not a crash
            _call(fn, data)
    except allowed:
        pass


# ---- the reported cases, pinned


def test_bitwise_equality_of_dicts_of_arrays_is_a_config_error():
    # found by the junk fuzz: numpy compared the dicts themselves, and a dict of arrays has no truth value
    junk = {"W1": np.array([]), "W2": np.array(["a", "b"])}
    with pytest.raises(ConfigError, match="must be a real number or an array of real numbers"):
        exactness.assert_bitwise_equal(junk, junk)
    exactness.assert_bitwise_equal(np.array([1.0, -0.0]), np.array([1.0, 0.0]))  # numbers still compare


def test_count_params_of_a_dict_names_the_config_class():
    with pytest.raises(ConfigError,
                       match=r"cfg=\{'hidden_size': 8\} must be a TransformerConfig "
                             r"\(see distcheck.parallel.params.PRESETS\)"):
        params.count_params({"hidden_size": 8})
    for fn in (params.param_tensors, params.component_counts):
        with pytest.raises(ConfigError, match="must be a TransformerConfig"):
            fn("llama-2-7b")


@pytest.mark.parametrize("fn", [layout.mesh_axes, layout.mesh_shape, layout.mesh_dim_names, layout.rank_grid,
                                layout.tp_groups_node_local, lambda c: layout.groups(c, "tp"),
                                lambda c: layout.coords(c, 0), lambda c: layout.node_of(c, 0),
                                lambda c: layout.groups_node_local(c, "dp"), lambda c: layout.rank_of(c, tp=0)])
def test_layout_functions_reject_what_is_not_a_parallel_config(fn):
    with pytest.raises(ConfigError, match=r"cfg=.* must be a ParallelConfig"):
        fn({"tp": 2, "dp": 2})


def test_layout_enumerators_refuse_huge_worlds_and_arithmetic_works_at_any_size():
    cfg = ParallelConfig(tp=8, pp=10**6, dp=10**6)
    for fn in (lambda: layout.groups(cfg, "tp"), lambda: layout.rank_grid(cfg)):
        with pytest.raises(ConfigError) as e:
            fn()
        assert e.value.field == "world_size" and e.value.value == 8 * 10**12 and "16777216" in e.value.rule
    last = cfg.world_size - 1
    assert layout.coords(cfg, last) == {"tp": 7, "cp": 0, "pp": 10**6 - 1, "dp": 10**6 - 1}
    assert layout.rank_of(cfg, tp=7, pp=10**6 - 1, dp=10**6 - 1) == last
    assert layout.node_of(cfg, last) == last // 8
    assert cfg.num_groups("tp") == 10**12
    assert layout.tp_groups_node_local(cfg) is True and layout.groups_node_local(cfg, "dp") is False


def test_mse_grad_on_empty_arrays_is_a_config_error_not_nan():
    with pytest.raises(ConfigError) as e:
        dp.mse_grad(np.zeros(2), np.zeros((0, 2)), np.zeros(0))
    assert e.value.field == "X.shape" and "must not be empty" in e.value.rule
    with pytest.raises(ConfigError, match=r"X\.shape=\(2,\) must be \(n, d\)"):
        dp.mse_loss(np.zeros(2), np.zeros(2), np.zeros(2))
    with pytest.raises(ConfigError, match="must be finite"):
        dp.mse_grad(np.zeros(2), np.array([[1.0, np.nan]]), np.zeros(1))
    with pytest.raises(ConfigError, match=r"y\.shape=\(3,\) must start with n=2"):
        dp.mse_grad_sum(np.zeros(2), np.ones((2, 2)), np.zeros(3))


def test_pipeline_simulate_refuses_a_billion_microbatches_and_points_to_the_closed_form():
    with pytest.raises(ConfigError) as e:
        pipeline.simulate("gpipe", p=4, m=10**9)
    assert e.value.field == "m" and e.value.value == 10**9
    assert "pp.MAX_ACTIONS = 10000000" in e.value.rule
    assert "distcheck.closed_form.get('pp.step_ticks.gpipe').evaluate(p=4, m=1000000000)" in e.value.rule
    with pytest.raises(ConfigError, match=r"v=2"):
        pipeline.schedule_order("interleaved", 4, 4 * 10**6, 2)
    # a long timeline (huge tick costs) has its figures; only its tick grid is refused, when asked for
    t = pipeline.simulate("1f1b", 2, 2, t_f=10**8)
    assert t.step_ticks == 3 * (10**8 + 2)
    with pytest.raises(ConfigError) as e:
        t.grid  # noqa: B018
    assert e.value.field == "num_ranks*step_ticks"
    with pytest.raises(ConfigError) as e:
        pipeline.replay({0: []}, 10**4, 10**3 + 1)
    assert e.value.field == "num_microbatches" and "MAX_ACTIONS" in e.value.rule
