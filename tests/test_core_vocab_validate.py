"""The core's vocabulary and its one set of validation helpers.

- The vocabulary (distcheck.core.vocab) is where a schedule, collective or axis name is
  written: the references, strategies and forms take their tuples from it, and no other
  module of the core, engine, packages, audit or plan spells one out as a string literal.
- The validation helpers (distcheck.core.validate) accept numpy integers and refuse bools,
  everywhere: in the references, the configs and the strategies alike.
"""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis.errors import InvalidArgument

from distcheck import strategies as ds
from distcheck.core import validate
from distcheck.core.errors import ConfigError, IntervalError
from distcheck.core.vocab import LAYOUT_ORDER, Axis, Collective, Schedule, Verdict, names
from distcheck.parallel import comm, layout, params, tp, zero
from distcheck.parallel import pp as pipeline

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------- vocabulary


def test_members_are_their_strings_everywhere():
    assert names(Schedule) == ("gpipe", "1f1b", "interleaved", "looped_bfs", "zb_h1", "zb_h2", "interleaved_zb", "zb_v",
                               "dualpipe", "dualpipev")
    assert names(Collective) == ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
    assert names(Axis) == ("tp", "cp", "pp", "dp", "ep", "dp_replicate", "dp_shard")
    assert tuple(LAYOUT_ORDER) == ("tp", "cp", "pp", "dp")
    assert names(Verdict) == ("pass", "FAIL", "skip", "finding")
    assert Schedule.ONE_F_ONE_B == "1f1b" and f"{Collective.ALL_REDUCE}" == "all_reduce"
    assert repr(Schedule.GPIPE) == "'gpipe'" and str(Axis.TP) == "tp"
    assert json.dumps([Collective.BROADCAST, Verdict.FAIL]) == '["broadcast", "FAIL"]'
    assert pickle.loads(pickle.dumps(Schedule.INTERLEAVED)) is Schedule.INTERLEAVED
    # a case holding a member prints as it would holding the plain string
    assert repr(ds.PipelineParams(Schedule.GPIPE, 2, 1)) == repr(ds.PipelineParams("gpipe", 2, 1))


def test_the_modules_take_their_names_from_the_vocabulary():
    assert pipeline.SCHEDULES == names(Schedule)
    assert comm.COLLECTIVES == names(Collective)
    assert layout.AXES == (*LAYOUT_ORDER, Axis.EP) and layout.DEFAULT_ORDER == tuple(LAYOUT_ORDER)
    assert "pipeline_params()" == repr(ds.pipeline_params())
    # every schedule has its closed forms, every collective its volume
    from distcheck.closed_form import catalogue

    forms = catalogue()
    assert all(f"pp.bubble_fraction.{s}" in forms for s in Schedule)
    assert all(f"comm.bytes_per_rank.{c}" in forms for c in Collective)


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants of a module, docstrings and ``__all__`` entries left out."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(c) for c in ast.walk(node.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def test_no_schedule_or_collective_name_is_written_outside_the_vocabulary():
    vocabulary = set(names(Schedule)) | set(names(Collective))
    written = [f"{p.relative_to(ROOT)}:{line}: {text!r}"
               for p in sorted((ROOT / "distcheck").rglob("*.py"))
               if p.name != "vocab.py"
               for line, text in _literals(p) if text in vocabulary]
    assert written == []



def _literals_of(text: str) -> list[tuple[int, str]]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    return _literals(Path(f.name))


# ----------------------------------------------------------------------------- one set of validation helpers


@pytest.mark.parametrize("value", [np.int64(3), np.int32(3), np.uint8(3), 3])
def test_integers_include_numpy_integers_and_come_back_as_int(value):
    got = validate.check_int("n", value, min_value=1)
    assert got == 3 and type(got) is int
    assert type(validate.check_positive_int("n", value)) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None, np.float64(3)])
def test_bools_and_non_integers_are_refused(value):
    with pytest.raises(ConfigError) as e:
        validate.check_int("n", value)
    assert e.value.field == "n" and e.value.rule == "must be an integer"
    assert str(e.value).startswith("n=") and str(e.value).endswith(" must be an integer")


def test_one_message_format_field_value_rule():
    with pytest.raises(ConfigError, match=r"^tp=0 must be >= 1$"):
        validate.check_positive_int("tp", np.int64(0))
    with pytest.raises(ConfigError, match=r"^tp=3 must divide num_kv_heads=8$"):
        validate.check_divides("tp", 3, "num_kv_heads", 8)
    with pytest.raises(ConfigError, match=r"^schedule='zb' must be one of 'gpipe', '1f1b', 'interleaved'$"):
        validate.check_choice("schedule", "zb", tuple(Schedule)[:3])
    assert validate.check_choice("schedule", "gpipe", tuple(Schedule)) == "gpipe"  # a plain string passes a member
    with pytest.raises(ConfigError, match=r"^microbatch=-1 must be an integer >= 0$"):
        validate.check_int("microbatch", -1, min_value=0, rule="must be an integer >= 0")


def test_the_strategies_check_with_the_same_helpers_in_hypothesis_words():
    with pytest.raises(IntervalError) as e:
        validate.check_interval("min_tp", 2, "max_tp", np.int64(1))
    assert str(e.value) == "Cannot have max_tp=1 < min_tp=2"
    assert (e.value.field, e.value.value, e.value.rule) == ("max_tp", 1, "must be >= min_tp=2")
    assert isinstance(e.value, ConfigError) and str(pickle.loads(pickle.dumps(e.value))) == str(e.value)
    with pytest.raises(InvalidArgument, match=r"^Cannot have max_shards=2 < min_shards=3$"):
        ds.shard_counts(min_shards=3, max_shards=np.int64(2))
    with pytest.raises(InvalidArgument, match="max_shards=True must be an integer"):
        ds.shard_counts(max_shards=True)
    from hypothesis import find

    assert find(ds.shard_counts(min_shards=np.int64(2), max_shards=np.int64(2)), lambda n: True) == 2  # numpy ints
    with pytest.raises(InvalidArgument, match=r"max_size=1099511627776 must be < min_size \+ 16777216"):
        ds.shard_sizes(max_size=2**40)  # was a MemoryError: the sizes are listed to draw from


def test_the_references_accept_numpy_integers_and_compute_with_python_ints():
    assert tp.split_sizes(np.int64(10), np.int64(4)) == [3, 3, 2, 2]
    got = zero.model_state_bytes_per_gpu(np.int64(7_500_000_000), np.int64(64), np.int64(3))
    assert got == 1_875_000_000 and type(got) is int
    # the product of two int64 sizes overflows numpy but not the reference: the checks return Python ints
    huge = zero.model_state_bytes_per_gpu(np.int64(2**62), np.int64(1), np.int64(0))
    assert huge == 16 * 2**62
    cfg = params.TransformerConfig(hidden_size=np.int64(8), num_layers=np.int32(2), ffn_hidden_size=16,
                                   num_heads=4, vocab_size=32, tied_embeddings=np.bool_(True))
    assert type(cfg.hidden_size) is int and cfg.tied_embeddings is True
    assert params.count_params(cfg) == params.count_params(
        params.TransformerConfig(hidden_size=8, num_layers=2, ffn_hidden_size=16, num_heads=4, vocab_size=32,
                                 tied_embeddings=True))
    assert pipeline.Action("F", np.int64(1), np.int64(0)) == pipeline.Action("F", 1, 0)
    with pytest.raises(ConfigError, match=r"^swiglu=1 must be a bool$"):
        params.TransformerConfig(hidden_size=8, num_layers=1, ffn_hidden_size=4, num_heads=2, vocab_size=8, swiglu=1)


# ----------------------------------------------------------------------------- the sharded layer norm, now a reference


def test_sharded_layer_norm_is_validated_and_equals_layer_norm():
    x = np.array([[0.0, 1.0, 2.0, 5.0]])
    shards = [x[:, :1], x[:, 1:3], x[:, 3:]]
    assert np.array_equal(np.concatenate(tp.sharded_layer_norm(shards, 1.0), axis=-1), tp.layer_norm(x, 1.0))
    with pytest.raises(ConfigError, match=r"x_shards\[1\]\.shape=\(2, 1\) must start with \(1,\)"):
        tp.sharded_layer_norm([x[:, :1], np.ones((2, 1))])
    with pytest.raises(ConfigError, match="must be > 0 when a row is constant"):
        tp.sharded_layer_norm([np.ones((1, 2)), np.ones((1, 2))], 0.0)
    with pytest.raises(ConfigError, match="x_shards"):
        tp.sharded_layer_norm("not shards")
