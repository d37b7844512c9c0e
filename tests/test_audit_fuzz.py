"""Fuzzing the answer-key parser: random TOML text and random structures give either a
valid key or AnswerKeyError, never another exception, and nothing is ever evaluated."""

from __future__ import annotations

import builtins
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distcheck.audit import audit_key, list_quantities, parse_key
from distcheck.audit.keys import validate_data
from distcheck.core.errors import AnswerKeyError

# FUZZ_N=3000 for a longer local run (it passed 3000 examples per test when written)
SETTINGS = settings(max_examples=int(os.environ.get("FUZZ_N", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

GOOD = '''[meta]
title = "t"
source = "s"

[[claim]]
id = "a"
quantity = "memory.train_state_bytes"
inputs = { params = 6738149376, tp = 8 }
claimed = 13.48
unit = "GB"

[[claim]]
id = "b"
quantity = "pp.bubble_fraction.gpipe"
inputs = { p = 4, m = 16 }
claimed = "3/19"
unit = "fraction"

[[check]]
id = "c"
kind = "equal"
parts = ["a"]
'''

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["memory.train_state_bytes", "GB", "%", "@a", "80 GB", "3/7", "llama-3-70b", "holds",
                     "__import__('os').system('false')", "eval", "sum", "1e999"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
claim_keys = st.sampled_from(["id", "quantity", "inputs", "claimed", "unit", "rounding", "note", "section",
                              "expect", "bogus"])
claims = st.dictionaries(claim_keys, values, max_size=9)
structures = st.fixed_dictionaries(
    {"meta": st.one_of(st.fixed_dictionaries({"title": st.text(max_size=5), "source": st.text(max_size=5)}), values)},
    optional={"claim": st.one_of(st.lists(claims, max_size=3), values),
              "check": st.one_of(st.lists(st.dictionaries(st.sampled_from(
                  ["id", "kind", "total", "parts", "expect"]), values, max_size=5), max_size=2), values),
              "extra": values},
)


# Import everything once (sympy evaluates its own constant strings while its modules load),
# so that the guard below sees only what parsing and auditing a key does.
audit_key(parse_key(GOOD, "warm-up.toml"))
# the modules the audit imports lazily (presets; the numpy references its worked examples reuse)
import distcheck.parallel.dp.reference  # noqa: E402
import distcheck.parallel.layout.mesh  # noqa: E402  (layout orders: distcheck.audit.layout_order)
import distcheck.parallel.layout.reference  # noqa: E402
import distcheck.parallel.params.reference  # noqa: E402
import distcheck.parallel.tp.reference  # noqa: E402,F401


class _NoEval:
    """Fail the test if eval or exec runs while a key is parsed and audited."""

    def __enter__(self):
        self.saved = builtins.eval, builtins.exec, builtins.compile

        def boom(*a, **k):
            raise AssertionError("the answer-key parser evaluated code")

        builtins.eval = builtins.exec = boom
        return self

    def __exit__(self, *exc):
        builtins.eval, builtins.exec, builtins.compile = self.saved
        return False


def _one_line(err: AnswerKeyError, text: str | None = None) -> None:
    """Every error is one line starting with the file name; its line number (if any) is in the file."""
    msg = str(err)
    assert msg.startswith("fuzz.toml") and "\n" not in msg, msg
    if text is not None and err.line is not None:
        assert 1 <= err.line <= max(1, len(text.splitlines()) + 1), (err.line, msg)


def _parse_and_audit(text):
    try:
        key = parse_key(text, "fuzz.toml")
    except AnswerKeyError as err:
        _one_line(err, text)
        return
    try:
        audit_key(key)
    except AnswerKeyError as err:
        _one_line(err, text)


def _validate_and_audit(data):
    with _NoEval():
        try:
            key = validate_data(data, path="fuzz.toml")
        except AnswerKeyError as err:
            _one_line(err)
            return
        try:
            audit_key(key)
        except AnswerKeyError as err:
            _one_line(err)


@SETTINGS
@given(st.text(max_size=300))
def test_random_text_never_raises_anything_but_answer_key_error(text):
    with _NoEval():
        _parse_and_audit(text)


@SETTINGS
@given(st.integers(min_value=0, max_value=len(GOOD) - 1), st.integers(min_value=1, max_value=30), st.text(max_size=12))
def test_mutated_valid_keys_never_raise_anything_but_answer_key_error(start, length, insert):
    text = GOOD[:start] + insert + GOOD[start + length:]
    with _NoEval():
        _parse_and_audit(text)


@SETTINGS
@given(st.sampled_from(["claimed", "unit", "quantity", "inputs", "rounding", "expect", "id"]), values)
def test_random_field_values_never_raise_anything_but_answer_key_error(field, value):
    import tomllib

    data = tomllib.loads(GOOD)
    data["claim"][0][field] = value
    _validate_and_audit(data)


@SETTINGS
@given(structures)
def test_random_structures_never_raise_anything_but_answer_key_error(data):
    _validate_and_audit(data)


# well-formed claims on every quantity with random input values: reaches the closed forms, the
# presets and the convention search, where a value out of a form's domain must still end as an
# AnswerKeyError (or a verdict), never a ConfigError, ZeroDivisionError or TypeError
_QUANTITIES = list_quantities()
input_values = st.one_of(
    st.integers(min_value=-3, max_value=10**12), st.floats(min_value=-1e3, max_value=1e15, allow_nan=False),
    st.booleans(), st.sampled_from(["80 GB", "1 GiB", "3/7", "@a", "0 GB", "llama-3-70b", "lesson-70b-style",
                                    "tp-cp-ep-dp-pp", "tp-tp-dp", "100 GB/s"]),
    st.lists(st.integers(min_value=-5, max_value=5), min_size=1, max_size=4),
    st.lists(st.lists(st.integers(min_value=-5, max_value=5), min_size=1, max_size=3), min_size=1, max_size=3),
)


@st.composite
def catalogue_claims(draw):
    q = draw(st.sampled_from(_QUANTITIES))
    names = [i["name"] for i in q["inputs"]]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))) if names else []
    inputs = {n: draw(input_values) for n in chosen}
    return {"id": "b", "quantity": q["name"], "inputs": inputs,
            "claimed": draw(st.one_of(st.integers(min_value=0, max_value=10**6), st.sampled_from(["~9", "3/7", "1.5"]),
                                      st.booleans(), st.lists(st.integers(0, 9), min_size=1, max_size=4))),
            "unit": draw(st.sampled_from(["GB", "GiB", "bytes", "%", "fraction", "GPUs", "count", "ticks",
                                          "params", "flag", "value", "M tokens", "layers", "x", "GB/s", "GiB/s"]))}


@SETTINGS
@given(catalogue_claims())
def test_random_claims_on_every_quantity_give_a_verdict_or_answer_key_error(rc):
    import tomllib

    data = tomllib.loads(GOOD)
    data["claim"][1] = rc
    _validate_and_audit(data)


def test_the_seed_key_is_valid():
    key = parse_key(GOOD, "good.toml")
    assert [c.id for c in key.claims] == ["a", "b"]


# the key fields added for real-library figures: the mesh order of layout.* quantities (with the degrees
# an order needs), and bandwidth quantities and units
_LAYOUT = [q for q in _QUANTITIES if q["name"].startswith("layout.")]
_BANDWIDTH = [q for q in _QUANTITIES if q["name"].startswith(("comm.algbw", "comm.busbw", "zero.comm_bytes"))]
orders = st.one_of(
    st.sampled_from(["tp-cp-ep-dp-pp", "tp-dp-pp", "dp-tp-cp-pp", "pp-dp-cp-tp", "tp-tp-dp", "tp-xp-dp", "", "-",
                     "ep", "tp,cp,pp,dp", "TP-DP"]),
    st.text(max_size=12), st.integers(), st.lists(st.text(max_size=3), max_size=3), st.booleans())


@st.composite
def layout_claims(draw):
    q = draw(st.sampled_from(_LAYOUT))
    names = [i["name"] for i in q["inputs"] if i["name"] != "order"] + ["tp", "cp", "pp", "dp"]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    inputs = {n: draw(st.one_of(st.integers(min_value=-2, max_value=64), input_values)) for n in chosen}
    if draw(st.booleans()):
        inputs["order"] = draw(orders)
    return {"id": "b", "quantity": q["name"], "inputs": inputs,
            "claimed": draw(st.one_of(st.integers(min_value=-1, max_value=10**4), st.booleans(),
                                      st.sampled_from(["~9", "3/7", "1.5"]))),
            "unit": draw(st.sampled_from(["GPUs", "count", "flag", "fraction", "groups", "GB/s", "tokens"]))}


@st.composite
def bandwidth_claims(draw):
    q = draw(st.sampled_from(_BANDWIDTH))
    names = [i["name"] for i in q["inputs"]]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    inputs = {n: draw(st.one_of(input_values, st.sampled_from(["1 GB", "0.01", "-1", "1e-9"]))) for n in chosen}
    return {"id": "b", "quantity": q["name"], "inputs": inputs,
            "claimed": draw(st.one_of(st.integers(min_value=-1, max_value=10**6),
                                      st.sampled_from(["175", "~100", "0"]))),
            "unit": draw(st.sampled_from(["GB/s", "GiB/s", "MB/s", "B/s", "bytes_per_second", "GB", "KiB/s", "%"]))}


@SETTINGS
@given(layout_claims())
def test_random_orders_and_degrees_on_layout_quantities_give_a_verdict_or_answer_key_error(rc):
    import tomllib

    data = tomllib.loads(GOOD)
    data["claim"][1] = rc
    _validate_and_audit(data)


@SETTINGS
@given(bandwidth_claims())
def test_random_bandwidth_claims_give_a_verdict_or_answer_key_error(rc):
    import tomllib

    data = tomllib.loads(GOOD)
    data["claim"][1] = rc
    _validate_and_audit(data)
