"""Every golden key audits with each verdict equal to its `expect`, carries provenance,
and a golden that lies about a verdict fails."""

from __future__ import annotations

from fractions import Fraction

import pytest

from distcheck.audit import UNDECIDED, VERDICTS, audit_file, load_key
from distcheck.core.errors import AnswerKeyError, GoldenError
from distcheck.golden import default_golden_dir, golden_paths, load_golden, verify, verify_all
from distcheck.report import FAIL, PASS, SKIP

GOLDEN = sorted(default_golden_dir().glob("*.toml"))
EXPECTED_FILES = {"lesson.toml", "chapter.toml", "zero_paper.toml", "llama3_table4.toml", "korthikanti.toml",
                  "zero_bubble.toml", "context_parallel.toml", "checkpoint.toml",
                  "moe.toml", "palm.toml", "megatron_2021.toml"}


def test_the_seven_golden_keys_ship():
    assert EXPECTED_FILES <= {p.name for p in GOLDEN}


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_every_golden_verdict_equals_expect(path):
    result = audit_file(path)
    mismatched = [(v.claim.id, v.verdict, v.claim.expect, v.explanation)
                  for v in result.claims if v.verdict != v.claim.expect]
    assert not mismatched
    bad_checks = [(c.id, c.verdict, c.expect) for c in result.checks
                  if c.verdict != (c.expect if not c.automatic else "consistent")]
    assert not bad_checks
    rows = verify(path)
    undecided = {_name(v.claim.id, path) for v in result.claims if v.verdict in UNDECIDED}
    assert rows and all(r.verdict == (SKIP if r.check in undecided else PASS) and r.backend == "golden" for r in rows)
    assert len(rows) == len(result.claims) + len(result.checks)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_every_golden_claim_has_provenance(path):
    key = load_golden(path)
    assert key.source.strip() and key.title.strip()
    for c in key.claims:
        assert c.section.strip() and c.expect in VERDICTS


def _name(claim_id: str, path) -> str:
    return claim_id if claim_id.startswith(path.stem + ".") else f"{path.stem}:{claim_id}"


_UNDECIDED_KEY = ('[meta]\ntitle = "t"\nsource = "s"\n[[claim]]\nid = "g.gpus"\nquantity = "reported.fact"\n'
                  'claimed = 8\nunit = "GPUs"\nsection = "x"\nexpect = "not-checkable"\n{note}'
                  '[[claim]]\nid = "g.world"\nquantity = "layout.world_size"\ninputs = {{ tp = 2, pp = 2 }}\n'
                  'claimed = 8\nunit = "GPUs"\nsection = "x"\nexpect = "not-checkable"\n{note}')


def test_the_golden_stage_is_strict_about_undecided_claims(tmp_path):
    """An undecided claim (not-checkable, ambiguous) is never a pass: recorded with its verdict and a reason
    (its note) it is a skip naming the reason; recorded without a reason it FAILs; expected to be decided
    (holds) it FAILs as any other mismatch."""
    p = tmp_path / "g.toml"
    p.write_text(_UNDECIDED_KEY.format(note=""))
    rows = {r.check: r for r in verify(p)}
    assert {k: r.verdict for k, r in rows.items()} == {"g.gpus": FAIL, "g.world": FAIL}
    assert "without a reason" in rows["g.gpus"].detail and "needs dp" in rows["g.world"].detail
    p.write_text(_UNDECIDED_KEY.format(note='note = "a hardware fact"\n'))
    rows = {r.check: r for r in verify(p)}
    assert {k: r.verdict for k, r in rows.items()} == {"g.gpus": SKIP, "g.world": SKIP}
    assert rows["g.gpus"].detail.startswith("undecided, recorded as not-checkable with its reason: a hardware fact")
    assert rows["g.gpus"].examples == 0
    p.write_text(_UNDECIDED_KEY.format(note='note = "a hardware fact"\n').replace('"not-checkable"', '"holds"', 1))
    assert verify(p)[0].verdict == FAIL and "golden records holds" in verify(p)[0].detail


def test_shipped_ambiguous_golden_claim_is_a_skip_with_its_reason():
    rows = {r.check: r for r in verify(default_golden_dir() / "chapter.toml")}
    row = rows["chapter.zero.stage3"]
    assert row.verdict == SKIP and "undecided, recorded as ambiguous with its reason: two readings" in row.detail


def test_the_golden_keys_exercise_every_verdict():
    """Every verdict but holds-through-input-rounding: the shipped sources print their inputs exactly (no claim
    of theirs reads an input printed with precision); tests/test_audit_rounded_inputs.py exercises that one."""
    seen = {v.verdict for p in GOLDEN for v in audit_file(p).claims}
    assert seen == set(VERDICTS) - {"holds-through-input-rounding"}


def test_pinned_golden_values():
    """Values a wrong closed form or a wrong golden would miss (exact)."""
    lesson = {v.claim.id: v for v in audit_file(default_golden_dir() / "lesson.toml").claims}
    assert lesson["lesson.7b.state_bytes"].computed == 107_810_390_016
    assert lesson["lesson.70b.params"].computed == 68_975_329_280
    assert lesson["lesson.7b.activations"].computed == 822_083_584
    assert lesson["lesson.pp.p4m4.bubble"].computed * 7 == 3
    chapter = {v.claim.id: v for v in audit_file(default_golden_dir() / "chapter.toml").claims}
    assert chapter["chapter.70b.weights"].computed == 2 * 70_553_706_496
    assert chapter["chapter.70b.adam"].convention.endswith("nominal parameter count from the model name")
    assert "12 B/param" in chapter["chapter.70b.total"].convention
    assert chapter["chapter.pp.bubble_formula"].convention == "bubble relative to ideal (useful) time"
    zero = {v.claim.id: v for v in audit_file(default_golden_dir() / "zero_paper.toml").claims}
    assert [zero[f"zero.{k}"].computed for k in ("baseline", "pos", "pos_g", "pos_g_p")] == [
        120 * 10**9, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    llama = {v.claim.id: v for v in audit_file(default_golden_dir() / "llama3_table4.toml").claims}
    assert {llama[f"llama3.r{i}.tokens"].computed for i in (1, 2, 3)} == {2**24}


def test_a_golden_with_a_false_expect_fails(tmp_path):
    text = (default_golden_dir() / "zero_paper.toml").read_text()
    p = tmp_path / "tampered.toml"
    p.write_text(text.replace('claimed = 31.4\nunit = "GB"', 'claimed = 31.9\nunit = "GB"', 1))
    rows = {r.check: r for r in verify(p)}
    row = rows["tampered:zero.pos"]
    assert row.verdict == FAIL and "golden records holds" in row.detail


def test_golden_rules_require_expect_and_section(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text('[meta]\ntitle = "t"\nsource = "s"\n[[claim]]\nid = "a"\nquantity = "layout.world_size"\n'
                 'inputs = { tp = 2, pp = 2, dp = 2 }\nclaimed = 8\nunit = "GPUs"\nsection = "x"\n')
    assert load_key(p).claims[0].expect is None  # fine as an answer key
    with pytest.raises(AnswerKeyError, match="needs expect"):
        load_golden(p)
    rows = verify(p)
    assert len(rows) == 1 and rows[0].verdict == FAIL


def test_verify_all_and_missing_folder(tmp_path):
    rows = verify_all()
    assert rows and all(r.verdict == PASS or (r.verdict == SKIP and r.detail.startswith("undecided, recorded as"))
                        for r in rows)
    assert len(golden_paths()) == len(GOLDEN)
    with pytest.raises(GoldenError):
        golden_paths(tmp_path / "nope")
    with pytest.raises(GoldenError):
        golden_paths(tmp_path)


def _printed(path) -> set[str]:
    """The figures of a golden key as printed (commas and '~' dropped; vectors as their text)."""
    return {c.claimed_text if c.claimed_text.startswith("[") else c.claimed_text.replace(",", "").lstrip("~")
            for c in load_golden(path).claims}


# Figures as the lesson "Scaling and distributed training" and "Chapter 26: Distributed Training" print
# them (numbers only, read off the two documents by hand).
LESSON_FIGURES = [
    "16", "12", "2", "8", "16384", "6738149376", "107810390016", "107.81", "0.822", "108.63", "13.48",
    "67108864", "8388608", "150994944", "234881024", "704643072", "855638016", "68451041280", "524288000",
    "68975329280", "1103.61", "137.95", "68.98", "6.7e-02", "4.4e-16", "0.0e+00", "1.5e-14", "6.2e-15",
    "[1, 2, 4, 7]", "[1, 2]", "[4, 7]", "[1, 0, 2, 1]", "[0, 2, 2, 6]", "21", "42.9", "3/7", "15.8", "3/19",
    "8.6", "18.75", "57", "128", "1/128", "1024", "671", "37", "2048", "79", "15/19", "1.10",
]
CHAPTER_FIGURES = [
    "140", "810", "560", "3240", "30", "170", "870", "5030", "11", "63", "210", "158", "109", "9", "3/32",
    "280", "17.5", "1024", "8", "126", "2048", "4096",
]


@pytest.mark.parametrize("name, figures", [("lesson.toml", LESSON_FIGURES), ("chapter.toml", CHAPTER_FIGURES)])
def test_every_seed_figure_is_a_golden_claim(name, figures):
    printed = _printed(default_golden_dir() / name)
    assert [f for f in figures if f not in printed] == []


def test_predict_exercise_answers_are_computed():
    lesson = {v.claim.id: v for v in audit_file(default_golden_dir() / "lesson.toml").claims}
    answers = {"lesson.ex1.bubble_8x8_exact": Fraction(7, 15), "lesson.ex2.plain_weight_small_shard": Fraction(1, 56),
               "lesson.ex2.error_coefficient_small_shard": Fraction(1, 840),
               "lesson.ex3.min_tp_pp_70b": 16, "lesson.ex4.swapped_order_exact": 0, "lesson.pred.relu_on_slices": 1,
               "lesson.pred.layer_norm_on_slices": 0, "lesson.pp.p8m32.bubble": Fraction(7, 39),
               "lesson.pred.adam_8bit": 10, "lesson.dp.equal_shard_weight": Fraction(1, 64),
               "lesson.13b.state": 208 * 10**9, "lesson.13b.min_tp": 4, "lesson.13b.bubble": Fraction(1, 5)}
    assert {k: lesson[k].computed for k in answers} == answers
    chapter = {v.claim.id: v for v in audit_file(default_golden_dir() / "chapter.toml").claims}
    assert chapter["chapter.3d.layers_per_stage"].computed == 16  # (126 + 2) / 8 from the preset's 126 layers
    assert chapter["chapter.zero.stage3"].verdict == "ambiguous"
    assert {a["unit"] for a in chapter["chapter.zero.stage3"].alternatives} == {"GB", "GiB"}
