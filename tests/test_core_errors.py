"""Every ConfigError of the core references that the per-module tests do not reach; every error pickles whole.

One table: each row is a call with bad input, the field the error must name,
the value it must carry and a piece of the rule. The message must read
``field=value rule``. Rows were found by tracing which ``raise ConfigError``
lines tests/test_{dp,tp,attention,pipeline,memory,zero,activations,params,layout,comm}.py
leave unexecuted; together they reach every validation branch of those modules.
"""

from __future__ import annotations

import inspect
import pickle
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from distcheck.core import errors, units
from distcheck.core.errors import ConfigError
from distcheck.parallel import comm, dp, layout, memory, tp
from distcheck.parallel import pp as pipeline

ONE = np.ones

_ANY = object()  # the value is an array shape or a long repr: not pinned


def _mlp_params():
    return {"W1": ONE((2, 3)), "b1": ONE(3), "W2": ONE((3, 1)), "b2": ONE(1)}


class _Torchish:  # duck-typed torch.distributed.pipelining action
    def __init__(self, kind, mb=0, stage=0):
        self.computation_type = SimpleNamespace(name=kind)
        self.microbatch_index, self.stage_index = mb, stage

    def __repr__(self):
        return f"_Torchish({self.computation_type.name})"


ROWS = [
    # ---- dp: shapes
    ("mse_loss X not 2-D", lambda: dp.mse_loss(ONE(2), ONE(3), ONE(3)), "X.shape", (3,), "must be (n, d)"),
    ("mse_loss y not X @ w", lambda: dp.mse_loss(ONE(2), ONE((3, 2)), ONE((3, 4))), "y.shape", (3, 4),
     "must match X @ w"),
    ("mlp missing key", lambda: dp.mlp_loss_and_grad({"W1": ONE((2, 3))}, ONE((4, 2)), ONE((4, 1))),
     "params", ["W1"], "must have keys W1, b1, W2, b2"),
    ("mlp y shape", lambda: dp.mlp_loss_and_grad(_mlp_params(), ONE((4, 2)), ONE((4, 2))), "y.shape", (4, 2),
     "must be (4, 1)"),
    ("token X not 3-D", lambda: dp.token_mse_grad_sum(ONE(2), ONE((3, 2)), ONE(3), ONE(3)), "X.shape", (3, 2),
     "must be (batch, seq, d)"),
    ("token mask shape", lambda: dp.token_mse_grad_sum(ONE(2), ONE((3, 4, 2)), ONE((3, 4)), ONE((3, 3))),
     "mask.shape", (3, 3), "must be (3, 4) (batch, seq)"),
    ("token w shape", lambda: dp.token_mse_grad_sum(ONE(5), ONE((3, 4, 2)), ONE((3, 4)), ONE((3, 4))),
     "w.shape", (5,), "must start with d=2"),
    ("token y shape", lambda: dp.token_mse_grad_sum(ONE(2), ONE((3, 4, 2)), ONE((3, 5)), ONE((3, 4))),
     "y.shape", (3, 5), "must be (3, 4)"),
    ("token loss no valid token", lambda: dp.token_mse_loss(ONE(2), ONE((3, 4, 2)), ONE((3, 4)), np.zeros((3, 4))),
     "mask", "all zeros", "must have at least one valid token"),
    ("token grad no valid token", lambda: dp.token_mse_grad(ONE(2), ONE((3, 4, 2)), ONE((3, 4)), np.zeros((3, 4))),
     "mask", "all zeros", "must have at least one valid token"),
    ("shard_grads y rows", lambda: dp.shard_grads(dp.mse_grad, ONE(2), ONE((4, 2)), ONE(3), 2), "y.shape", (3,),
     "must start with n=4"),
    ("plain_mean empty", lambda: dp.plain_mean([]), "grads", [], "must be non-empty"),
    ("plain_mean dict keys", lambda: dp.plain_mean([{"a": ONE(1)}, {"b": ONE(1)}]), "grads", ["a"],
     "must all be dicts with the same keys"),
    ("plain_mean_bias lengths", lambda: dp.plain_mean_bias([ONE(2)], [1, 2]), "sizes", [1, 2],
     "must have one positive entry per gradient sum (1)"),
    ("accumulate no micro-batches", lambda: dp.accumulate_grads(dp.mse_grad_sum, ONE(2), ONE((4, 2)), ONE(4), []),
     "microbatch_sizes", [], "must be non-empty"),
    ("accumulate y rows", lambda: dp.accumulate_grads(dp.mse_grad_sum, ONE(2), ONE((4, 2)), ONE(3), [2, 2]),
     "y.shape", (3,), "must start with batch=4"),
    ("accumulate mask rows", lambda: dp.accumulate_grads(dp.token_mse_grad_sum, ONE(2), ONE((4, 3, 2)), ONE((4, 3)),
                                                          [2, 2], "tokens", mask=ONE((3, 3))),
     "mask.shape", (3, 3), "must start with batch=4"),
    ("accumulate tokens all masked", lambda: dp.accumulate_grads(dp.token_mse_grad_sum, ONE(2), ONE((4, 3, 2)),
                                                                  ONE((4, 3)), [2, 2], "tokens", mask=np.zeros((4, 3))),
     "mask", "all zeros", "must have at least one valid token"),
    ("gamma k u >= 1", lambda: dp.gamma(2**53), "k", 2**53, "must satisfy k*u < 1"),
    ("gamma not int", lambda: dp.gamma(1.5), "k", 1.5, "must be an integer >= 0"),
    # ---- tp: shapes
    ("W not 2-D", lambda: tp.column_parallel(ONE(3), ONE(3), 1), "W.shape", (3,), "must be (d_in, d_out)"),
    ("swiglu up shape", lambda: tp.swiglu_mlp(ONE(2), ONE((2, 4)), ONE((2, 3)), ONE((4, 2))), "W_up.shape", (2, 3),
     "must equal W_gate.shape=(2, 4)"),
    ("tp swiglu up shape", lambda: tp.tp_swiglu_mlp(ONE(2), ONE((2, 4)), ONE((2, 3)), ONE((4, 2)), 2), "W_up.shape",
     (2, 3), "must equal W_gate.shape=(2, 4)"),
    ("tp swiglu down shape", lambda: tp.tp_swiglu_mlp(ONE(2), ONE((2, 4)), ONE((2, 4)), ONE((3, 2)), 2),
     "W_down.shape", (3, 2), "must start with ffn=4"),
    ("fused down shape", lambda: tp.tp_swiglu_mlp_fused(ONE(2), ONE((2, 8)), ONE((3, 2)), 2), "W_down.shape", (3, 2),
     "must start with ffn=4"),
    ("fused x shape", lambda: tp.tp_swiglu_mlp_fused(ONE(3), ONE((2, 8)), ONE((4, 2)), 2), "x.shape", (3,),
     "must end with d=2"),
    # ---- layout / pipeline / comm
    ("rank_of non-int index", lambda: layout.rank_of(layout.ParallelConfig(tp=2), tp=1.0), "tp", 1.0,
     "must be an integer"),
    ("replay order type", lambda: pipeline.replay("abc", 1, 1), "order", "str",
     "must be a dict {rank: [Action, ...]} or a list of lists"),
    ("replay rank list type", lambda: pipeline.replay({0: "F"}, 1, 1), "order[0]", "str", "must be a list of actions"),
    ("torch order type", lambda: pipeline.from_torch_actions(42), "pipeline_order", "int",
     "must be a dict {rank: [action, ...]} or a list of lists"),
    ("torch unknown kind", lambda: pipeline.from_torch_actions([[_Torchish("MYSTERY")]]), "pipeline_order[0]", _ANY,
     "has computation type 'MYSTERY'"),
    ("torch bad index", lambda: pipeline.from_torch_actions([[_Torchish("FORWARD", mb=-1)]]), "pipeline_order[0]", _ANY,
     "is not a valid action: microbatch=-1 must be an integer >= 0"),
    ("broadcast data not 1-D", lambda: comm.chain_broadcast(ONE((2, 2)), 2), "data", (2, 2), "must be a 1-D array"),
    ("volume float size", lambda: comm.volume("all_reduce", 1.5, 2), "size_bytes", 1.5,
     "must be an int or Fraction number of bytes"),
    ("volume string size", lambda: comm.volume("all_reduce", "8", 2), "size_bytes", "8",
     "must be an int or Fraction number of bytes"),
    # ---- units and byte strings
    ("unknown unit", lambda: units.bytes_to(1, "gb"), "unit", "gb", "must be one of bytes, B, KB"),
    ("parse no unit", lambda: units.parse_bytes("80"), "size", "80", "must be a number followed by a unit"),
    ("parse unknown unit", lambda: units.parse_bytes("80 gib"), "unit", "gib", "must be one of"),
    ("parse not a string", lambda: units.parse_bytes(80), "size", 80, "must be a string like '80 GB'"),
    ("format digits", lambda: units.format_bytes(1, "GB", -1), "digits", -1, "must be an integer >= 0"),
    ("budget bad string", lambda: memory.min_tp(10**9, "eighty GB"), "budget_bytes", "eighty GB",
     "must be a number followed by a unit"),
    ("budget float", lambda: memory.min_tp(10**9, 80e9), "budget_bytes", 80e9,
     "must be an int or Fraction number of bytes (exact; no floats)"),
    ("gpu bytes zero", lambda: memory.min_gpus("870 GB", "0 GB"), "gpu_bytes", 0, "must be > 0"),
]


@pytest.mark.parametrize("call, field, value, rule", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_config_error_names_field_value_rule(call, field, value, rule):
    with pytest.raises(ConfigError) as info:
        call()
    err = info.value
    assert err.field == field
    if value is not _ANY:
        assert err.value == value
    assert rule in err.rule, err.rule
    assert str(err) == f"{field}={err.value!r} {err.rule}"


def test_byte_strings_are_exact_in_both_units():
    assert units.parse_bytes("80 GB") == 80 * units.GB == 80_000_000_000
    assert units.parse_bytes("80 GiB") == 80 * units.GiB == 85_899_345_920
    assert units.parse_bytes("0.1 GB") == 100_000_000
    assert units.parse_bytes("1.5 KiB") == 1536
    assert units.parse_bytes("1,024 B") == 1024
    assert units.parse_bytes("0.5 B") == Fraction(1, 2)


def test_format_bytes_rounds_the_exact_value():
    assert units.format_bytes(107_810_390_016) == "107.81 GB"
    assert units.format_bytes(107_810_390_016, "GiB") == "100.41 GiB"
    assert units.format_bytes(1_103_605_268_480) == "1,103.61 GB"
    assert units.format_bytes(1_103_605_268_480, "TB", 3) == "1.104 TB"
    assert units.format_bytes(125, "KB", 2) == "0.12 KB"  # 0.125 -> half to even
    assert units.format_bytes(135, "KB", 2) == "0.14 KB"
    assert units.format_bytes(-1_500_000_000, "GB", 1) == "-1.5 GB"
    assert units.format_bytes(5, "B", 0) == "5 B"


# ----------------------------------------------------------------------------- every exception survives pickling

#: one instance per exception class of distcheck.core.errors (re-exported as distcheck.core.errors), every optional
#: field set to a non-default value; a class added to the module without a row here fails
#: test_every_error_class_has_a_pickle_sample
PICKLE_SAMPLES = {
    "DistcheckError": lambda: errors.DistcheckError("something broke", 3),
    "ConfigError": lambda: errors.ConfigError("tp", Fraction(3, 2), "must divide num_kv_heads=8"),
    "IntervalError": lambda: errors.IntervalError("min_tp", 4, "max_tp", 2),
    "UnknownQuantityError": lambda: errors.UnknownQuantityError("zero.byts", ["zero.bytes", "zero.stage"], "property"),
    "GoldenError": lambda: errors.GoldenError("golden/lesson.toml does not reproduce"),
    "AnswerKeyError": lambda: errors.AnswerKeyError("must be a table", path="key.toml", line=7, field="claim.inputs"),
    "PropertyFailure": lambda: errors.PropertyFailure("row_exact", expected=[1.0, 2.0], got=[1.0, 2.5],
                                                      max_error=0.5, bound=1e-12),
    "ImplementationError": lambda: errors.ImplementationError("implementation row_parallel raised ZeroDivisionError",
                                                              kind="raised", error_type="ZeroDivisionError"),
    "DistributedError": lambda: errors.DistributedError("payload differs between ranks"),
    "RankFailure": lambda: errors.RankFailure(1, "Traceback...\nValueError: bad", failures={1: "tb 1", 3: "tb 3"}),
    "WorldTimeout": lambda: errors.WorldTimeout("step did not finish", ranks=[0, 2], stacks={0: "s0", 2: "s2"},
                                                timeout_s=1.5),
    "BackendUnavailable": lambda: errors.BackendUnavailable("backend 'nccl' needs CUDA GPUs; none is visible"),
}


def _error_classes() -> list[type]:
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == errors.__name__]


def _public(err: BaseException) -> dict:
    return {k: v for k, v in vars(err).items() if not k.startswith("_")}


def test_every_error_class_has_a_pickle_sample():
    names = sorted(cls.__name__ for cls in _error_classes())
    assert "RankFailure" in names and "ConfigError" in names  # the walk finds the module's classes
    assert names == sorted(PICKLE_SAMPLES)


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_error_keeps_every_field_through_pickle(cls):
    err = PICKLE_SAMPLES[cls.__name__]()
    assert type(err) is cls
    err.add_note("raised while checking tp=3")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert copy.args == err.args
    assert str(copy) == str(err)
    assert _public(copy) == _public(err)
    assert copy.__notes__ == ["raised while checking tp=3"]


def test_rank_failure_fields_survive_pickle_with_failures_from_the_constructor():
    err = errors.RankFailure(2, "tb 2", failures={2: "tb 2", 5: "tb 5"})
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.rank, copy.traceback_text, copy.failures) == (2, "tb 2", {2: "tb 2", 5: "tb 5"})
    assert str(copy).startswith("rank 2 failed:\ntb 2")
    assert errors.RankFailure(4, "tb 4").failures == {4: "tb 4"}  # default: the reported rank alone


def test_a_huge_integer_is_shown_in_scientific_notation():
    from distcheck.core.errors import ConfigError

    assert str(ConfigError("params", 10**400, "must be <= 10**18")) == "params=1.000000e+400 must be <= 10**18"
    assert str(ConfigError("params", 10**29, "r")) == f"params={10**29} r"


def test_a_negative_size_says_so():
    import pytest

    from distcheck.core.errors import ConfigError
    from distcheck.core.units import parse_bytes

    with pytest.raises(ConfigError, match="size='-80GB' must not be negative"):
        parse_bytes("-80GB")
