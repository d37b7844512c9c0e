"""The answer-key audit: parsing, rounding inference, units, each verdict, each convention,
cross-claim consistency, error messages with file/line/field, and the reports."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from distcheck.audit import (
    VERDICTS,
    audit_exit_code,
    audit_file,
    audit_key,
    list_quantities,
    parse_key,
    render,
    render_quantity_list,
)
from distcheck.audit.claim_units import unit_factor
from distcheck.audit.numbers import parse_printed
from distcheck.audit.presets import nominal_params
from distcheck.core.errors import AnswerKeyError

META = '[meta]\ntitle = "t"\nsource = "s"\n'


def key(*claims: str, checks: str = "") -> str:
    return META + "".join(f"\n[[claim]]\n{c.strip()}\n" for c in claims) + checks


def claim(cid, quantity, inputs, claimed, unit, extra=""):
    return (f'id = "{cid}"\nquantity = "{quantity}"\ninputs = {inputs}\nclaimed = {claimed}\n'
            f'unit = "{unit}"\n{extra}')


def audit_text(text: str):
    return audit_key(parse_key(text, "k.toml"))


def one(text: str):
    r = audit_text(text)
    assert len(r.claims) == 1
    return r.claims[0]


# ----------------------------------------------------------------------------- rounding inference


@pytest.mark.parametrize("text, value, step", [
    ("107.81", Fraction(10781, 100), Fraction(1, 100)),
    ("~109", Fraction(109), Fraction(1)),
    ("42.9", Fraction(429, 10), Fraction(1, 10)),
    ("1,103.61", Fraction(110361, 100), Fraction(1, 100)),
    ("16_384", Fraction(16384), Fraction(0)),   # a whole number in full is exact
    ("1,024", Fraction(1024), Fraction(0)),
    ("5", Fraction(5), Fraction(0)),
    ("~5", Fraction(5), Fraction(1)),           # unless marked as rounded
    ("5.", Fraction(5), Fraction(1)),
    ("7e9", Fraction(7 * 10**9), Fraction(10**9)),
    ("6.7e-02", Fraction(67, 1000), Fraction(1, 1000)),
    ("108.60", Fraction(1086, 10), Fraction(1, 100)),
    ("3/7", Fraction(3, 7), Fraction(0)),
    (".5", Fraction(1, 2), Fraction(1, 10)),
])
def test_printed_numbers_carry_the_step_of_their_last_digit(text, value, step):
    p = parse_printed(text)
    assert (p.value, p.step) == (value, step)


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1,2", "1/0", "--1", "1e999", "eval('1')"])
def test_non_numbers_are_refused(text):
    assert parse_printed(text) is None


def test_rounding_is_read_from_the_toml_literal_trailing_zero_kept():
    # 108.60 printed: +-0.005, so 108.632 (the true value) is NOT 108.60
    c = claim("a", "memory.state_plus_activations_bytes",
              '{ params = 6738149376, activation_bytes = 822083584 }', "108.60", "GB")
    v = one(key(c))
    assert v.claim.step == Fraction(1, 100)
    assert v.verdict == "wrong"
    # the same value printed with one decimal (+-0.05) holds
    assert one(key(claim("a", "memory.state_plus_activations_bytes",
                         '{ params = 6738149376, activation_bytes = 822083584 }', "108.6", "GB"))).verdict == "holds"


def test_explicit_rounding_overrides_the_digits():
    base = claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", "108", "GB")
    v = one(key(base))
    assert (v.claim.step, v.verdict) == (0, "wrong")  # "108" is exact; the state is 107.81 GB
    v = one(key(base + "rounding = 1\n"))
    assert (v.claim.step, v.claim.step_inferred, v.verdict) == (1, False, "holds")  # 107.81 is within 108 +- 0.5
    approx = claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", '"~108"', "GB")
    assert one(key(approx)).verdict == "holds"
    v = one(key(base + "rounding = 0.1\n"))
    assert (v.claim.step, v.claim.step_inferred) == (Fraction(1, 10), False)
    assert v.verdict != "holds"  # not within 108 +- 0.05


def test_a_stated_rounding_must_divide_the_figure():
    base = claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", "108", "GB")
    with pytest.raises(AnswerKeyError, match=r"k.toml:\d+: \[claim\[0\] \(a\).rounding\] rounding = 5 must divide "
                                             r"the printed figure 108"):
        parse_key(key(base + "rounding = 5\n"), "k.toml")


def test_half_step_boundary_is_inclusive_and_exact():
    # 3/8 = 0.375: printed 0.38 (+-0.005) holds exactly at the boundary; 0.37 too; 0.36 does not
    for printed, verdict in (("0.38", "holds"), ("0.37", "holds")):
        c = claim("a", "pp.bubble_ratio.gpipe", "{ p = 4, m = 8 }", printed, "fraction")
        assert one(key(c)).verdict == verdict
    c = claim("a", "pp.bubble_ratio.gpipe", "{ p = 4, m = 8 }", "0.36", "fraction")
    assert one(key(c)).verdict != "holds"


# ----------------------------------------------------------------------------- units


def test_unit_conversions_are_exact():
    assert unit_factor("bytes", "GB") == 10**9
    assert unit_factor("bytes", "GiB") == 2**30
    assert unit_factor("bytes", "TB") == 10**12
    assert unit_factor("fraction", "%") == Fraction(1, 100)
    assert unit_factor("tokens", "M tokens") == 10**6
    assert unit_factor("tokens", "Mi tokens") == 2**20
    assert unit_factor("count", "GPUs") == 1
    with pytest.raises(ValueError):
        unit_factor("bytes", "%")
    with pytest.raises(ValueError):
        unit_factor("params", "GPUs")


def test_a_figure_in_tb_gib_or_bytes_is_compared_in_that_unit():
    inputs = "{ params = 68975329280 }"
    assert one(key(claim("a", "memory.train_state_bytes", inputs, "1.10", "TB"))).verdict == "holds"
    assert one(key(claim("a", "memory.train_state_bytes", inputs, "1103605268480", "bytes"))).verdict == "holds"
    # 1,103,605,268,480 bytes = 1027.8 GiB
    assert one(key(claim("a", "memory.train_state_bytes", inputs, "1027.8", "GiB"))).verdict == "holds"


def test_input_strings_with_units_are_converted():
    # 900 GB over 80 GB cards: ceil(11.25) = 12; over 80 GiB cards: ceil(10.48) = 11
    c = claim("a", "memory.min_gpus", '{ total_bytes = "900 GB", gpu_bytes = "80 GB" }', 12, "GPUs")
    assert one(key(c)).verdict == "holds"
    c = claim("a", "memory.min_gpus", '{ total_bytes = "900 GB", gpu_bytes = "80 GiB" }', 12, "GPUs")
    v = one(key(c))
    assert v.verdict == "wrong" and v.computed == 11


# ----------------------------------------------------------------------------- verdicts


def test_holds():
    v = one(key(claim("a", "memory.train_state_bytes", "{ params = 6738149376, bytes_per_param = 16 }",
                      "107.81", "GB")))
    assert v.verdict == "holds"
    assert v.computed == 107_810_390_016
    assert v.computed_in_unit == Fraction(107_810_390_016, 10**9)


def test_wrong_reports_the_recomputed_value_and_the_closest_alternative():
    v = one(key(claim("a", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", "50", "%")))
    assert v.verdict == "wrong"
    assert v.computed == Fraction(3, 7)
    assert "42.857" in v.explanation
    assert v.alternatives and v.alternatives[0]["convention"] == "bubble relative to ideal (useful) time"


def test_not_checkable_for_a_random_draw_and_a_reported_fact():
    v = one(key('id = "e"\nquantity = "empirical.max_abs_error"\nclaimed = 6.7e-02\nunit = "value"'))
    assert v.verdict == "not-checkable" and "random draw" in v.explanation
    v = one(key('id = "f"\nquantity = "reported.fact"\nclaimed = 671\nunit = "B params"'))
    assert v.verdict == "not-checkable"


def test_not_checkable_when_a_required_input_is_missing():
    v = one(key(claim("a", "pp.bubble_fraction.gpipe", "{ p = 4 }", "9", "%")))
    assert v.verdict == "not-checkable" and "needs m" in v.explanation


def test_ambiguous_when_two_conventions_reproduce_and_the_default_does_not():
    # 1e9 params: 16 GB by default; 12 B/param gives 12 GB and 8-bit Adam 10 GB; a figure of
    # "12 GB" printed with rounding 4 (+-2) covers both alternatives but not the default
    base = claim("a", "memory.train_state_bytes", "{ params = 1e9 }", "12", "GB")
    v = one(key(base + "rounding = 4\n"))
    assert v.verdict == "ambiguous"
    assert sorted(a["value"] for a in v.alternatives) == [10, 12]
    # printed exactly, only the 12 B/param reading remains
    v = one(key(claim("a", "memory.train_state_bytes", "{ params = 1e9 }", "12", "GB")))
    assert v.verdict == "holds-under-another-convention" and v.convention.startswith("12 B/param")


def test_convention_bytes_per_param_12_16_18_and_8bit():
    for bpp, figure in ((12, "80.86"), (18, "121.29"), (10, "67.38")):
        v = one(key(claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", figure, "GB")))
        assert v.verdict == "holds-under-another-convention", (bpp, v.explanation)
        assert f"{bpp} B/param" in v.convention


def test_convention_fp32_master_in_zero():
    # ZeRO stage 3 with K = 8 (no master): (4 + 8) x 7.5e9 / 64 = 1.40625 GB
    v = one(key(claim("a", "zero.bytes_per_gpu.stage3", "{ params = 7.5e9, dp = 64 }", "1.41", "GB")))
    assert v.verdict == "holds-under-another-convention" and "K = 8" in v.convention


def test_convention_gb_vs_gib():
    v = one(key(claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", "100.41", "GB")))
    assert v.verdict == "holds-under-another-convention" and v.convention == "GB read as GiB (2^30 bytes)"
    assert v.alternatives[0]["unit"] == "GiB"  # the reproducing value is in GiB, not in the printed GB
    v = one(key(claim("a", "memory.train_state_bytes", "{ params = 6738149376 }", "107.81", "GiB")))
    assert v.verdict == "holds-under-another-convention" and v.convention == "GiB read as GB (1e9 bytes)"


def test_convention_bubble_total_vs_ideal():
    v = one(key(claim("a", "pp.bubble_fraction.gpipe", "{ p = 4, m = 16 }", "18.75", "%")))
    assert v.verdict == "holds-under-another-convention" and "ideal" in v.convention
    v = one(key(claim("a", "pp.bubble_ratio.1f1b", "{ p = 4, m = 16 }", "15.8", "%")))
    assert v.verdict == "holds-under-another-convention" and "total" in v.convention


def test_convention_activations_replicated_or_sharded():
    # tensor parallel (replicated LayerNorm/dropout inputs) vs tensor + sequence parallel (sharded)
    inputs = "{ s = 2048, b = 1, h = 12288, a = 96, t = 8 }"
    v = one(key(claim("a", "activations.bytes_per_layer.tp", inputs, "358612992", "bytes")))
    assert v.verdict == "holds-under-another-convention" and "sequence parallel" in v.convention
    v = one(key(claim("a", "memory.per_gpu_bytes.zero3",
                      '{ params = 70e9, dp = 8, activation_bytes = "30 GB", k = 8 }', "108.75", "GB")))
    assert v.verdict == "holds-under-another-convention" and "dp ranks" in v.convention


def test_convention_ep_inside_or_outside_dp():
    v = one(key(claim("a", "layout.world_size.ep_inside_dp", "{ tp = 8, pp = 4, dp = 8, ep = 4 }", 1024, "GPUs")))
    assert v.verdict == "holds-under-another-convention" and "outside" in v.convention
    v = one(key(claim("a", "layout.world_size.ep_outside_dp", "{ tp = 8, pp = 4, dp = 8, ep = 4 }", 256, "GPUs")))
    assert v.verdict == "holds-under-another-convention" and "carved out of the data-parallel ranks" in v.convention


def test_convention_full_tensor_vs_shard_and_ring_factor():
    # all-gather of a 1 GB shard per rank over 8 ranks: full tensor 8 GB, each rank sends 7 GB
    v = one(key(claim("a", "comm.bytes_per_rank.all_gather", '{ size_bytes = "1 GB", n = 8 }', 7, "GB")))
    assert v.verdict == "holds-under-another-convention" and "shard" in v.convention
    v = one(key(claim("a", "comm.bytes_per_rank.all_reduce", '{ size_bytes = "1 GB", n = 8 }', "2.0", "GB")))
    assert v.verdict == "holds-under-another-convention" and "ring factor" in v.convention


def test_convention_nominal_parameter_count_of_a_preset():
    assert nominal_params("llama-3-70b") == 70 * 10**9
    assert nominal_params("llama-3.2-1b") == 10**9
    v = one(key(claim("a", "memory.weights_bytes", '{ model = "llama-3-70b" }', 140, "GB")))
    assert v.verdict == "holds-under-another-convention" and "nominal" in v.convention
    v = one(key(claim("a", "memory.weights_bytes", '{ model = "llama-3-70b" }', "141.1", "GB")))
    assert v.verdict == "holds"


def test_presets_fill_architecture_inputs_and_explicit_inputs_win():
    v = one(key(claim("a", "params.decoder_only", '{ model = "llama-3-8b" }', '"8,030,261,248"', "params")))
    assert v.verdict == "holds"
    v = one(key(claim("a", "params.decoder_only", '{ model = "llama-3-8b", tied = 1 }', '"7,504,924,672"', "params")))
    assert v.verdict == "holds"  # minus the 128,256 x 4,096 output head


def test_claim_references_use_the_other_claims_printed_figure():
    text = key(
        claim("t", "memory.train_state_bytes", "{ params = 68975329280, tp = 8 }", "137.95", "GB"),
        claim("f", "memory.fits", '{ total_bytes = "@t", gpu_bytes = "80 GB" }', "false", "flag"),
    )
    assert [v.verdict for v in audit_text(text).claims] == ["holds", "holds"]


# ----------------------------------------------------------------------------- consistency


def test_sum_check_finds_a_contradiction_naming_the_claims():
    checks = ('\n[[check]]\nid = "s"\nkind = "sum"\ntotal = "tot"\nparts = ["w", "o"]\n'
              '\n[[check]]\nid = "s2"\nkind = "sum"\ntotal = "tot2"\nparts = ["w", "o"]\n')
    text = key(
        claim("w", "memory.weights_bytes", "{ params = 70e9 }", 140, "GB"),
        claim("o", "memory.optimizer_bytes", "{ params = 70e9 }", 840, "GB"),
        claim("tot", "memory.train_state_bytes", "{ params = 70e9, bytes_per_param = 14 }", 980, "GB"),
        claim("tot2", "memory.train_state_bytes", "{ params = 70e9, bytes_per_param = 14 }", 990, "GB"),
        checks=checks,
    )
    r = audit_text(text)
    by = {c.id: c for c in r.checks}
    assert by["s"].verdict == "consistent"
    assert by["s2"].verdict == "contradiction" and set(by["s2"].claims) == {"w", "o", "tot2"}
    # tot and tot2: same quantity and inputs, different figures -> automatic contradiction
    auto = [c for c in r.checks if c.automatic]
    assert len(auto) == 1 and auto[0].verdict == "contradiction" and set(auto[0].claims) == {"tot", "tot2"}
    assert audit_exit_code(r) == 1


def test_product_check_for_a_layout_and_equal_check_across_units():
    checks = ('\n[[check]]\nid = "p"\nkind = "product"\ntotal = "g"\nparts = [8, 16, 64]\n'
              '\n[[check]]\nid = "e"\nkind = "equal"\nparts = ["b1", "b2"]\n')
    text = key(
        claim("g", "layout.world_size", "{ tp = 8, pp = 16, dp = 128 }", '"16,384"', "GPUs"),
        claim("b1", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", "42.9", "%"),
        claim("b2", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", '"3/7"', "fraction"),
        checks=checks,
    )
    by = {c.id: c for c in audit_text(text).checks}
    assert by["p"].verdict == "contradiction"  # 8 x 16 x 64 = 8,192
    assert by["e"].verdict == "consistent"


def test_same_quantity_same_inputs_with_defaults_filled_must_agree():
    text = key(
        claim("a", "memory.train_state_bytes", "{ params = 1e9 }", 16, "GB"),
        claim("b", "memory.train_state_bytes", "{ params = 1e9, bytes_per_param = 16 }", 18, "GB"),
    )
    auto = [c for c in audit_text(text).checks if c.automatic]
    assert len(auto) == 1 and auto[0].verdict == "contradiction"


def test_exit_code_zero_without_wrong_claims():
    r = audit_text(key(claim("a", "layout.world_size", "{ tp = 2, pp = 2, dp = 2 }", 8, "GPUs")))
    assert audit_exit_code(r) == 0


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("body, line, field, words", [
    ('id = "a"\nquantity = "memory.train_stat_bytes"\nclaimed = 1\nunit = "GB"', 7, "quantity",
     "did you mean memory.train_state_bytes"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { parms = 1 }\nclaimed = 1\nunit = "GB"', 8,
     "inputs.parms", "not an input"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 1 }\nclaimed = 1\nunit = "gigabytes"',
     10, "unit", "unknown unit"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 1 }\nclaimed = 1\nunit = "%"',
     10, "unit", "cannot measure"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 1 }\nclaimed = "lots"\nunit = "GB"',
     9, "claimed", "not a number"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 0 }\nclaimed = 1\nunit = "GB"',
     8, "inputs.params", "must be an integer >= 1"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 1 }\nclaimed = 1\nunit = "GB"\n'
     'expect = "fine"', 11, "expect", "expect must be one of"),
    ('id = "a"\nquantity = "memory.train_state_bytes"\ninputs = { params = 1 }\nclaimed = 1\nunit = "GB"\n'
     'colour = "red"', 11, "colour", "unknown field"),
])
def test_errors_name_file_line_and_field(body, line, field, words):
    text = key(body)
    with pytest.raises(AnswerKeyError) as info:
        parse_key(text, "bad.toml")
    err = info.value
    assert err.path == "bad.toml" and err.line == line, (err.line, str(err))
    assert err.field.endswith(field)
    assert words in str(err)
    assert str(err).startswith(f"bad.toml:{line}: [")


def test_bad_toml_and_missing_meta_and_duplicate_ids():
    with pytest.raises(AnswerKeyError, match=r"k.toml:3: not valid TOML"):
        parse_key('[meta]\ntitle = "t"\nsource = \n', "k.toml")
    with pytest.raises(AnswerKeyError, match="missing \\[meta\\]"):
        parse_key('[[claim]]\nid = "a"\n', "k.toml")
    dup = claim("a", "layout.world_size", "{ tp = 1, pp = 1, dp = 1 }", 1, "GPUs")
    with pytest.raises(AnswerKeyError, match="duplicate id 'a'"):
        parse_key(key(dup, dup), "k.toml")


def test_closed_form_constraints_surface_as_answer_key_errors():
    c = claim("a", "layout.world_size.ep_inside_dp", "{ tp = 2, pp = 1, dp = 3, ep = 2 }", 6, "GPUs")
    with pytest.raises(AnswerKeyError, match="ep=2 must divide dp"):
        audit_text(key(c))


def test_a_declared_constraint_makes_the_claim_not_checkable_naming_it():
    c = claim("a", "pp.layers_per_stage.trim_ends", "{ num_layers = 126, p = 5 }", 8, "layers")
    (v,) = audit_text(key(c)).claims
    assert v.verdict == "not-checkable" and "p divides num_layers + 2 trimmed" in v.explanation
    assert "num_layers=126, p=5, trimmed=1" in v.explanation


def test_check_references_must_exist():
    checks = '\n[[check]]\nid = "s"\nkind = "sum"\ntotal = "nope"\nparts = ["a"]\n'
    with pytest.raises(AnswerKeyError, match="total 'nope' is not a claim id"):
        parse_key(key(claim("a", "layout.world_size", "{ tp = 1, pp = 1, dp = 1 }", 1, "GPUs"), checks=checks))


def test_audit_file_reads_from_disk(tmp_path):
    p = tmp_path / "k.toml"
    p.write_text(key(claim("a", "layout.world_size", "{ tp = 8, pp = 16, dp = 128 }", '"16,384"', "GPUs")))
    r = audit_file(p)
    assert r.claims[0].verdict == "holds"
    with pytest.raises(AnswerKeyError, match="cannot read"):
        audit_file(tmp_path / "missing.toml")


# ----------------------------------------------------------------------------- reports and catalogue


def test_reports_in_three_formats():
    text = key(
        claim("a", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", "42.9", "%"),
        claim("b", "pp.bubble_fraction.gpipe", "{ p = 4, m = 16 }", "18.75", "%"),
    )
    r = audit_text(text)
    data = json.loads(render(r, "json"))
    assert data[0]["claims"][0]["verdict"] == "holds"
    assert data[0]["claims"][0]["computed"]["exact"] == "3/7"
    assert data[0]["claims"][1]["convention"] == "bubble relative to ideal (useful) time"
    md = render(r, "markdown")
    assert "| `a` |" in md and "**holds-under-another-convention**" in md
    table = render(r, "table")
    assert "holds-under-another-convention" in table and "42.9 %" in table
    with pytest.raises(ValueError):
        render(r, "pdf")


def test_list_quantities_gives_inputs_units_defaults_and_sources():
    items = {q["name"]: q for q in list_quantities()}
    q = items["memory.train_state_bytes"]
    assert q["unit"] == "bytes" and q["source"]
    by = {i["name"]: i for i in q["inputs"]}
    assert by["bytes_per_param"]["default"] == 16 and by["params"]["default"] is None
    assert "model" in by  # presets accepted wherever params is an input
    assert items["empirical.max_abs_error"]["checkable"] is False
    assert "memory.train_state_bytes" in render_quantity_list("table")
    assert json.loads(render_quantity_list("json"))["conventions"]


def test_every_verdict_name_is_documented():
    assert VERDICTS == ("holds", "holds-through-input-rounding", "wrong", "holds-under-another-convention",
                        "ambiguous", "not-checkable")
    doc = (Path(__file__).parent.parent / "docs" / "AUDIT.md").read_text()
    assert all(f"| `{v}` |" in doc for v in VERDICTS)


# ----------------------------------------------------------------------------- every convention, one by one

#: (variant name, quantity, inputs, printed figure, unit, value of the reproducing reading in its unit).
#: Each figure is reproduced by exactly that one documented variant: the default and every other
#: single change give another value, so a variant that computed the wrong thing (or was missing)
#: would turn the verdict into `wrong` or `ambiguous`.
_K = "{ s = 2048, b = 1, h = 12288, a = 96, t = 8 }"
_PALM = ("{ params = 540350000000, num_layers = 118, num_heads = 48, head_dim = 256, seq_len = 2048, "
         "tokens_per_second = 238300, gpus = 6144, peak_flops = 275e12 }")

CONVENTION_CASES = [
    # PaLM 540B's MFU with 6N alone: 6 x 540.35e9 x 238,300 / (6144 x 275e12) = 45.73% (46.23% with attention)
    ("6N alone: the attention term 12 L H Q T left out (Kaplan et al. 2020's C = 6N per token)", "flops.mfu.palm",
     _PALM, "45.7", "%", Fraction(6 * 540_350_000_000 * 238_300 * 100, 6144 * 275 * 10**12)),
    # the same with the forward counted twice (8N + 16LHQT): 61.64%
    ("hardware FLOPs: the whole forward counted again (full recomputation, 8N + 16 L H Q T; an HFU)",
     "flops.mfu.palm", _PALM, "61.6", "%",
     Fraction((8 * 540_350_000_000 + 16 * 118 * 48 * 256 * 2048) * 238_300 * 100, 6144 * 275 * 10**12)),
    # 430 TFLOP/s of an H100 (989.5 dense): 43.46%; against the sparse 1,979: 21.73%
    ("peak read as the datasheet's figure with 2:4 structured sparsity (twice the dense peak)", "flops.utilization",
     "{ achieved_flops_per_gpu = 430e12, peak_flops = 989.5e12 }", "21.7", "%", Fraction(430 * 100, 1979)),
    ("dense peak meant, the figure given with 2:4 structured sparsity (half of it)", "flops.utilization",
     "{ achieved_flops_per_gpu = 430e12, peak_flops = 1979e12 }", "43.5", "%", Fraction(430 * 200, 1979)),
    # 1e9 bytes in 0.01 s over 8 ranks: algbw 100 GB/s, ring busbw 175 GB/s, in-network 100 x 7/9 GB/s
    ("in-network (SHARP) all-reduce bus-bandwidth factor (n-1)/(n+1)", "comm.busbw.all_reduce",
     "{ size_bytes = 1000000000, time_s = '1/100', n = 8 }", "77.78", "GB/s", Fraction(700, 9)),
    ("ring all-reduce bus-bandwidth factor 2(n-1)/n (nccl-tests)", "comm.busbw.all_reduce.in_network",
     "{ size_bytes = 1000000000, time_s = '1/100', n = 8 }", 175, "GB/s", 175),
    # ZeRO-3, 64e9 params over 64 ranks, largest layer 2e9 params: 16 + 2 x 2 = 20 GB; DeepSpeed 18 + 4 x 2 = 26
    ("DeepSpeed's ZeRO-3 estimator: int(18 Psi / N) + 4 x largest_layer_params (the largest layer gathered in fp32)",
     "zero.bytes_per_gpu.stage3_with_gather", "{ params = 64e9, dp = 64, largest_layer_params = 2e9 }", 26, "GB",
     26),
    ("16 B/param (bf16 weights and grads, fp32 master, Adam m and v)", "memory.train_state_bytes",
     "{ params = 1e9, bytes_per_param = 12 }", 16, "GB", 16),
    ("12 B/param (no fp32 master copy)", "memory.train_state_bytes", "{ params = 1e9 }", 12, "GB", 12),
    ("18 B/param (fp32 gradients)", "memory.train_state_bytes", "{ params = 1e9 }", 18, "GB", 18),
    ("10 B/param (8-bit Adam moments)", "memory.train_state_bytes", "{ params = 1e9 }", 10, "GB", 10),
    ("activations sharded t x p ways like the weights (not replicated)", "memory.state_plus_activations_bytes",
     '{ params = 1e9, tp = 2, pp = 2, activation_bytes = "8 GB" }', 6, "GB", 6),  # default 4 + 8 = 12 GB
    ("12 B/param of optimizer state (fp32 master + Adam m, v)", "memory.optimizer_bytes",
     "{ params = 1e9, optimizer_bytes_per_param = 8 }", 12, "GB", 12),
    ("8 B/param of optimizer state (Adam m, v only: no fp32 master)", "memory.optimizer_bytes",
     "{ params = 1e9 }", 8, "GB", 8),
    ("6 B/param of optimizer state (fp32 master + 8-bit moments)", "memory.optimizer_bytes",
     "{ params = 1e9 }", 6, "GB", 6),
    ("2 B/param of optimizer state (8-bit moments, no master)", "memory.optimizer_bytes",
     "{ params = 1e9 }", 2, "GB", 2),
    ("fp32 weights (4 B/param)", "memory.weights_bytes", "{ params = 1e9 }", 4, "GB", 4),
    ("16-bit weights (2 B/param)", "memory.weights_bytes", "{ params = 1e9, weight_bytes = 4 }", 2, "GB", 2),
    ("fp32 gradients (4 B/param)", "memory.grads_bytes", "{ params = 1e9 }", 4, "GB", 4),
    ("16-bit gradients (2 B/param)", "memory.grads_bytes", "{ params = 1e9, grad_bytes = 4 }", 2, "GB", 2),
    # ZeRO-3, 64e9 params over 64 ranks: (4 + K) GB per rank
    # (at stage 3, 16 GB would also be "fp32 gradients on top of 16-bit ones" with K = 8: 2 + 6 + 8;
    # stage 1 is 4 x 64 + K)
    ("K = 12 (fp32 master + Adam m, v)", "zero.bytes_per_gpu.stage1", "{ params = 64e9, dp = 64, k = 8 }",
     268, "GB", 268),
    ("K = 8 (Adam m, v only: no fp32 master)", "zero.bytes_per_gpu.stage3", "{ params = 64e9, dp = 64 }",
     12, "GB", 12),
    ("K = 6 (fp32 master + 8-bit moments)", "zero.bytes_per_gpu.stage3", "{ params = 64e9, dp = 64 }",
     10, "GB", 10),
    ("activations sharded across the dp ranks (not replicated on each)", "memory.per_gpu_bytes.zero3",
     '{ params = 64e9, dp = 64, activation_bytes = "64 GB" }', 17, "GB", 17),  # default 16 + 64 = 80 GB
    ("EP outside DP (expert-parallel ranks are extra GPUs: tp x cp x pp x dp x ep)",
     "layout.world_size.ep_inside_dp", "{ tp = 8, pp = 4, dp = 8, ep = 4 }", 1024, "GPUs", 1024),
    ("EP inside DP (expert groups carved out of the data-parallel ranks: no extra GPUs)",
     "layout.world_size.ep_outside_dp", "{ tp = 8, pp = 4, dp = 8, ep = 4 }", 256, "GPUs", 256),
    ("layer-input checkpoints only (no recompute working set)", "activations.checkpointed_peak_bytes",
     "{ s = 2048, b = 1, h = 4096, num_layers = 32 }", 536870912, "bytes", 536870912),  # 32 x 2sbh
    ("backward costs as much as forward (t_b = t_f)", "pp.step_ticks.gpipe", "{ p = 4, m = 4 }",
     14, "ticks", 14),  # 2 (m + p - 1) instead of 3 (m + p - 1) = 21
    ("nominal parameter count from the model name", "memory.weights_bytes", '{ model = "llama-3-70b" }',
     140, "GB", 140),
    ("bubble relative to ideal (useful) time", "pp.bubble_fraction.gpipe", "{ p = 4, m = 16 }",
     "18.75", "%", Fraction(75, 4)),
    ("bubble relative to total time", "pp.bubble_ratio.gpipe", "{ p = 4, m = 16 }", '"3/19"', "fraction",
     Fraction(3, 19)),
    # Korthikanti et al. Table 2 on GPT-3 175B (s 2048, h 12288, a 96, t 8): each row from another row's quantity
    ("no parallelism, everything stored", "activations.bytes_per_layer.tp", _K, 2868903936, "bytes", 2868903936),
    ("tensor parallel, activations outside TP regions replicated", "activations.bytes_per_layer.none", _K,
     578813952, "bytes", 578813952),
    ("tensor + sequence parallel (activations sharded)", "activations.bytes_per_layer.none", _K,
     358612992, "bytes", 358612992),
    ("tensor parallel + selective recompute (replicated)", "activations.bytes_per_layer.none", _K,
     327155712, "bytes", 327155712),
    ("tensor + sequence parallel + selective recompute (sharded)", "activations.bytes_per_layer.none", _K,
     106954752, "bytes", 106954752),
    ("full recompute (layer inputs only)", "activations.bytes_per_layer.none", _K, 50331648, "bytes", 50331648),
    ("size given is the per-rank shard (full tensor = n x size)", "comm.bytes_per_rank.all_gather",
     '{ size_bytes = "1 GB", n = 8 }', 7, "GB", 7),  # default 7/8 GB
    ("ring factor (n-1)/n dropped (the large-n limit; the ZeRO paper counts volumes this way)",
     "comm.bytes_per_rank.all_reduce", '{ size_bytes = "1 GB", n = 8 }', "2.0", "GB", 2),  # default 1.75 GB
    ("with the ring factor (n-1)/n (nccl-tests)", "comm.bytes_per_rank_no_ring_factor.all_reduce",
     '{ size_bytes = "1 GB", n = 8 }', "1.75", "GB", Fraction(7, 4)),
    # the ZeRO paper's 2 Psi elements (DDP) read on a ring of 8: 2 x 7/8 x 1e9 (a convention input, n)
    ("ring factor (n-1)/n kept (nccl-tests): (n-1)/n of the paper's count per rank, on a ring of n",
     "zero.comm_elements_per_rank.ddp", "{ params = 1e9, n = 8 }", "1.75e9", "elements", Fraction(175 * 10**7)),
    ("GB read as GiB (2^30 bytes)", "memory.train_state_bytes", "{ params = 6738149376 }", "100.41", "GB",
     Fraction(107810390016, 2**30)),
    ("GiB read as GB (1e9 bytes)", "memory.train_state_bytes", "{ params = 6738149376 }", "107.81", "GiB",
     Fraction(107810390016, 10**9)),
    ("M tokens read as Mi tokens (2^20)", "layout.tokens_per_batch", "{ dp = 64, batch_per_dp = 32, seq_len = 8192 }",
     16, "M tokens", 16),
    ("Mi tokens read as M tokens (1e6)", "layout.tokens_per_batch", "{ dp = 64, batch_per_dp = 32, seq_len = 8192 }",
     "16.78", "Mi tokens", Fraction(16777216, 10**6)),
    # blind spots of issue 11: K = 14 and 16, fp32 gradients, fp32 weights, maximum instead of sum, bandwidth units
    ("20 B/param (fp32 gradients on top of 16-bit ones)", "memory.train_state_bytes", "{ params = 1e9 }", 20, "GB", 20),
    ("fp32 gradients on top of 16-bit ones (6 B/param)", "memory.grads_bytes", "{ params = 1e9 }", 6, "GB", 6),
    # ZeRO-1, 64e9 params over 64 ranks: (w + g) x 64 + K GB per rank; the default (K = 12) is 268 GB
    ("K = 14 (18 B/param sharded at stage 3: DeepSpeed's ZeRO-3 estimator)", "zero.bytes_per_gpu.stage1",
     "{ params = 64e9, dp = 64 }", 270, "GB", 270),
    ("K = 16 (fp32 gradients counted with the optimizer state: DeepSpeed's ZeRO-2 estimator)",
     "zero.bytes_per_gpu.stage1", "{ params = 64e9, dp = 64 }", 272, "GB", 272),
    ("fp32 gradients instead of 16-bit ones (2 + 4 + K)", "zero.bytes_per_gpu.stage1", "{ params = 64e9, dp = 64 }",
     396, "GB", 396),
    ("fp32 gradients on top of 16-bit ones (2 + 2 + 4 + K)", "zero.bytes_per_gpu.stage1",
     "{ params = 64e9, dp = 64 }", 524, "GB", 524),
    ("fp32 weights with no separate master copy (4 + 4 + 8)", "zero.bytes_per_gpu.stage1",
     "{ params = 64e9, dp = 64 }", 520, "GB", 520),
    ("the maximum of the components instead of their sum (state, activations)", "memory.state_plus_activations_bytes",
     '{ params = 1e9, activation_bytes = "20 GB" }', 20, "GB", 20),  # the sum is 16 + 20 = 36 GB
    ("GB/s read as GiB/s (2^30 bytes/s)", "comm.busbw.all_reduce", "{ size_bytes = 1e9, time_s = '1/100', n = 8 }",
     "162.98", "GB/s", Fraction(175 * 10**9, 2**30)),
    ("GiB/s read as GB/s (1e9 bytes/s)", "comm.algbw", "{ size_bytes = 1073741824, time_s = '1/100' }", "107.37",
     "GiB/s", Fraction(107374182400, 10**9)),
    ("MB/s read as MiB/s (2^20 bytes/s)", "comm.algbw", "{ size_bytes = 1e9, time_s = 1000 }", "0.95", "MB/s",
     Fraction(10**6, 2**20)),
    ("MiB/s read as MB/s (1e6 bytes/s)", "comm.algbw", "{ size_bytes = 1048576, time_s = 1 }", "1.05", "MiB/s",
     Fraction(1048576, 10**6)),
    # the reading of a printed B, and the barrier between pipeline steps (docs/PIPELINES.md)
    ("B is the full backward (input and weight gradients: DeepSeek-V3 Table 2)", "pp.bubble_ticks.zb_h1.b_input",
     "{ p = 8, t_f = 1, b = 2, t_w = 1 }", 7, "ticks", 7),  # default 7 max(1 + 2 - 1, 1, 2) = 14
    ("B is the input-gradient pass only (Qi et al. 2023, T_B)", "pp.bubble_ticks.1f1b.b_full",
     "{ p = 4, t_f = 1, b = 1, t_w = 1 }", 9, "ticks", 9),  # default 3 (1 + 1) = 6
    ("no barrier between steps: the idle ticks inside each rank's own window (steps overlap)",
     "pp.bubble_ratio.zb_v", "{ p = 4, m = 8, t = 1 }", 0, "fraction", 0),  # default 3/48
]


@pytest.mark.parametrize("name, quantity, inputs, figure, unit, value", CONVENTION_CASES,
                         ids=[c[0][:40] for c in CONVENTION_CASES])
def test_each_convention_reproduces_its_figure_alone(name, quantity, inputs, figure, unit, value):
    v = one(key(claim("a", quantity, inputs, figure, unit)))
    assert v.verdict == "holds-under-another-convention", v.explanation
    assert v.convention == name
    assert v.alternatives[0]["value"] == value
    assert name in v.explanation and "\n" not in v.explanation


def test_every_documented_convention_has_a_case():
    from distcheck.audit.conventions import CONVENTIONS

    documented = {v.name for _, axis in CONVENTIONS for v in axis.variants}
    assert documented <= {c[0] for c in CONVENTION_CASES}


def test_deepspeed_zero3_estimator_printed_in_binary_units():
    """DeepSpeed prints its estimate divided by 2**30 with the label GB: 26e9 bytes prints as 24.21 "GB", the
    estimator and the binary unit together (two changes), while K = 16 alone (24 GB) does not reproduce it."""
    v = one(key(claim("a", "zero.bytes_per_gpu.stage3_with_gather",
                      "{ params = 64e9, dp = 64, largest_layer_params = 2e9 }", "24.21", "GB")))
    assert v.verdict == "holds-under-another-convention", v.explanation
    assert v.convention == ("DeepSpeed's ZeRO-3 estimator: int(18 Psi / N) + 4 x largest_layer_params (the largest "
                            "layer gathered in fp32) + GB read as GiB (2^30 bytes)")
    assert v.alternatives[0]["value"] == Fraction(26 * 10**9, 2**30) and v.alternatives[0]["unit"] == "GiB"
    assert one(key(claim("a", "zero.bytes_per_gpu.stage3_with_gather",
                         "{ params = 64e9, dp = 64, largest_layer_params = 2e9 }", 20, "GB"))).verdict == "holds"


def test_two_changes_at_once_are_tried_and_named():
    # 70e9 nominal params (the model's real count is 70.55e9) with 12 B/param: 840 GB; neither alone gives it
    v = one(key(claim("a", "memory.train_state_bytes", '{ model = "llama-3-70b" }', 840, "GB")))
    assert v.verdict == "holds-under-another-convention"
    assert v.convention == "12 B/param (no fp32 master copy) + nominal parameter count from the model name"
    assert v.alternatives[0]["value"] == 840


def test_three_changes_are_not_tried():
    # nominal 70e9 x 12 B/param = 840e9 bytes = 782.3 GiB needs three changes: the figure is wrong
    v = one(key(claim("a", "memory.train_state_bytes", '{ model = "llama-3-70b" }', "782.3", "GB")))
    assert v.verdict == "wrong"
    assert "no documented convention reproduces it" in v.explanation


def test_ambiguous_lists_every_reading_with_its_value():
    # 13e9 params over 80 GB: the default 16 B/param needs TP 4; both 12 and 10 B/param give TP 2
    v = one(key(claim("a", "memory.min_tp_pow2", '{ params = 13e9, budget_bytes = "80 GB" }', 2, "count")))
    assert v.verdict == "ambiguous" and v.computed == 4
    assert {a["convention"] for a in v.alternatives} == {"12 B/param (no fp32 master copy)",
                                                        "10 B/param (8-bit Adam moments)"}
    assert "12 B/param" in v.explanation and "10 B/param" in v.explanation


def test_wrong_explanation_is_one_readable_line():
    v = one(key(claim("a", "comm.bytes_per_rank.all_gather", '{ size_bytes = "140 GB", n = 8 }', "17.5", "GB")))
    assert v.verdict == "wrong" and v.computed == 122_500_000_000
    assert v.explanation.startswith("recomputed 122.5 (245/2) GB; printed 17.5 GB (+-0.05); off by 105 GB")
    assert "\n" not in v.explanation


def test_flags_read_as_true_or_false():
    v = one(key(claim("a", "memory.fits", '{ total_bytes = "81 GB", gpu_bytes = "80 GB" }', "false", "flag")))
    assert v.verdict == "holds" and v.explanation == "recomputed false; printed false (exact)"


# ----------------------------------------------------------------------------- lesson worked examples


def test_sliced_activation_relu_matches_and_layer_norm_does_not():
    base = "h = [1, -2, 4, -7], tp = 2"
    assert one(key(claim("a", "tp.example.sliced_activation_matches", f"{{ {base} }}", "true", "flag"))).computed == 1
    v = one(key(claim("a", "tp.example.sliced_activation_matches", f"{{ {base}, layer_norm = true }}", "false",
                      "flag")))
    assert v.verdict == "holds" and v.computed == 0
    # one shard is the whole vector: the layer norm is then the same
    v = one(key(claim("a", "tp.example.sliced_activation_matches", "{ h = [1, -2, 4, -7], tp = 1, layer_norm = true }",
                      "true", "flag")))
    assert v.computed == 1
    # a shard of one element has zero variance: refused unless eps > 0
    with pytest.raises(AnswerKeyError, match="eps"):
        audit_text(key(claim("a", "tp.example.sliced_activation_matches",
                             "{ h = [1, 2], tp = 2, layer_norm = true }", "false", "flag")))


def test_oversized_matrix_inputs_are_refused():
    rows = "[" + ", ".join(["[" + ", ".join(["1"] * 300) + "]"] * 300) + "]"
    with pytest.raises(AnswerKeyError, match="at most 65536 numbers"):
        parse_key(key(claim("a", "tp.example.full_output", f"{{ x = [1], w = {rows} }}", "[1]", "value")), "k.toml")


# ----------------------------------------------------------------------------- the CLI


def _cli(*args, cwd):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "distcheck", "audit", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_cli_bad_key_prints_one_line_and_exits_2(tmp_path):
    (tmp_path / "bad.toml").write_text(key('id = "a"\nquantity = "memory.train_stat_bytes"\nclaimed = 1\nunit = "GB"'))
    proc = _cli("bad.toml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("distcheck: error: bad.toml:7: [claim[0] (a).quantity] unknown quantity")


def test_cli_exits_1_on_a_wrong_claim_and_writes_json(tmp_path):
    (tmp_path / "k.toml").write_text(key(
        claim("ok", "layout.world_size", "{ tp = 8, pp = 16, dp = 128 }", '"16,384"', "GPUs"),
        claim("bad", "pp.bubble_fraction.gpipe", "{ p = 4, m = 4 }", "50", "%")))
    proc = _cli("k.toml", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert [c["verdict"] for c in data[0]["claims"]] == ["holds", "wrong"]
    assert data[0]["claims"][1]["computed"] == {"exact": "3/7", "approx": 3 / 7}


def test_the_closest_alternative_of_a_wrong_figure_is_a_single_convention():
    # 1e9 params, 9.5 GB: no reading reproduces it; 8-bit Adam's 10 GB read as GiB (9.31 GiB) is nearer than any
    # single reading, but a combination of two conventions is named only when it reproduces the figure
    v = one(key(claim("a", "memory.train_state_bytes", "{ params = 1e9 }", "9.5", "GB")))
    assert v.verdict == "wrong"
    assert [a["convention"] for a in v.alternatives] == ["10 B/param (8-bit Adam moments)"]
    assert v.alternatives[0]["value"] == 10 and "closest: 10 B/param (8-bit Adam moments) -> 10 GB" in v.explanation
    # a combination that reproduces the figure within its rounding is still found: 9.31 GiB printed as 9.3 GB
    both = one(key(claim("a", "memory.train_state_bytes", "{ params = 1e9 }", "9.3", "GB")))
    assert both.verdict != "wrong" and any(" + " in a["convention"] for a in both.alternatives), both.explanation
