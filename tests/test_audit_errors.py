"""Typed errors at the boundary of distcheck.closed_form, distcheck.golden and distcheck.audit:
a wrong type is a ConfigError naming the argument (never a bare TypeError or AttributeError from
inside), and a negative size or a -1 sentinel among a key's inputs is refused, not judged."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import sympy as sp

from distcheck import closed_form, golden
from distcheck.audit import conventions, counts, figures, keys, numbers, quantities, report, verdict
from distcheck.audit.consistency import check_key, figure_of
from distcheck.core.errors import AnswerKeyError, ConfigError, UnknownQuantityError

META = '[meta]\ntitle = "t"\nsource = "s"\n'
GOOD_KEY = keys.parse_key(META + '\n[[claim]]\nid = "a"\nquantity = "layout.world_size"\n'
                          'inputs = { tp = 2, pp = 2, dp = 2 }\nclaimed = 8\nunit = "GPUs"\n', "k.toml")
STATE = quantities.get_quantity("memory.train_state_bytes")

BAD_CALLS = [
    # (call, the message it must start with)
    (lambda: closed_form.get(123), "name=123 must be a str naming a closed form"),
    (lambda: closed_form.get(None), "name=None must be a str"),
    (lambda: closed_form.get(["pp.bubble_fraction.gpipe"]), "name=['pp.bubble_fraction.gpipe'] must be"),
    (lambda: closed_form.register("pp.bubble_fraction.gpipe"), "form='pp.bubble_fraction.gpipe' must be a"),
    (lambda: closed_form.Input("p", "stages", kind="postive_integer"), "kind='postive_integer' must be one of"),
    (lambda: closed_form.Input(3, "stages"), "name=3 must be a str"),
    (lambda: closed_form.ClosedForm("f", "p + 1", (), "count", "s", "d"), "expr='p + 1' must be a sympy expression"),
    (lambda: closed_form.ClosedForm("f", sp.Integer(1), ["p"], "count", "s", "d"), "inputs=['p'] must be a tuple"),
    (lambda: golden.golden_paths(123), "directory=123 must be a file path"),
    (lambda: golden.load_golden(None), "path=None must be a file path"),
    (lambda: golden.verify(b"golden/lesson.toml"), "path=b'golden/lesson.toml' must be a file path"),
    (lambda: golden.verify_all(1.5), "directory=1.5 must be a file path"),
    (lambda: keys.load_key(7), "path=7 must be a file path"),
    (lambda: keys.load_key(""), "path='' must be a non-empty str path"),
    (lambda: keys.parse_key(META, 7), "path=7 must name the key"),
    (lambda: keys.validate_data({}, text=3), "text=3 must be the key's TOML text"),
    (lambda: keys.parse_input_string(80, "bytes"), "text=80 must be a str"),
    (lambda: keys.parse_input_string("80 GB", None), "target_unit=None must be a unit name"),
    (lambda: quantities.get_quantity(3), "name=3 must be a str naming a quantity"),
    (lambda: quantities.unit_factor(None, "GB"), "quantity_unit=None must be a unit name"),
    (lambda: quantities.unit_factor("bytes", 1), "claim_unit=1 must be a unit name"),
    (lambda: quantities.unit_factor("bytes", "parsecs"), "claim_unit='parsecs' is not a known unit"),
    (lambda: quantities.unit_factor("bytes", "%"), "claim_unit='%' does not measure a quantity in 'bytes'"),
    (lambda: quantities.preset_inputs(["llama-3-70b"], STATE), "model=['llama-3-70b'] must be a preset name"),
    (lambda: quantities.preset_inputs("llama-3-70b", "memory.train_state_bytes"),
     "quantity='memory.train_state_bytes' must be a Quantity"),
    (lambda: quantities.nominal_params(70), "model=70 must be a preset name"),
    (lambda: conventions.axes_for(1, "GB", {}), "quantity=1 must be a quantity name"),
    (lambda: conventions.axes_for("memory.train_state_bytes", None, {}), "unit=None must be a unit name"),
    (lambda: conventions.axes_for("memory.train_state_bytes", "GB", ["params"]), "inputs=['params'] must map"),
    (lambda: numbers.format_exact("1/3"), "value='1/3' must be an int or a Fraction"),
    (lambda: numbers.format_exact(True), "value=True must be an int or a Fraction"),
    (lambda: numbers.format_exact(Fraction(1, 3), 0), "digits=0 must be an integer from 1 to 60"),
    (lambda: report.render(GOOD_KEY), "results=AnswerKey("),
    (lambda: report.render([None]), "results[0]=None must be an AuditResult"),
    (lambda: report.render([], "html"), "fmt='html' must be one of 'table', 'markdown', 'json'"),
    (lambda: report.render_quantity_list("csv"), "fmt='csv' must be one of"),
    (lambda: report.to_dict({}), "result={} must be an AuditResult"),
    (lambda: verdict.audit_key("golden/lesson.toml"), "key='golden/lesson.toml' must be an AnswerKey"),
    (lambda: verdict.audit_file(3), "path=3 must be a file path"),
    (lambda: verdict.audit_exit_code(None), "result=None must be an AuditResult"),
    (lambda: verdict.audit_exit_code([None]), "result[0]=None must be an AuditResult"),
    (lambda: counts.uneven_split(["q"], {}, Fraction(1, 2)), "quantity=['q'] must be a quantity name"),
    (lambda: counts.uneven_split("q", {}, 0.5), "value=0.5 must be a Fraction"),
    (lambda: figures.Figure(4), "value=4 must be a Fraction"),
    (lambda: figures.Figure(Fraction(4), Fraction(-1)), "step=-1 must be >= 0"),
    (lambda: figures.span_of(figures.Figure(Fraction(4), Fraction(1)), "banker's"), "rule=\"banker's\" must be one of"),
    (lambda: figures.check_sum(4, []), "total=4 must be a Figure"),
    (lambda: figures.check_sum(figures.Figure(Fraction(4)), []), "parts=[] must hold at least one figure"),
    (lambda: figures.check_equal([4]), "figures[0]=4 must be a Figure"),
    (lambda: figures.check_product(figures.Figure(Fraction(4)), None), "parts=None must be a list of Figure"),
    (lambda: figure_of("a"), "c='a' must be a Claim"),
    (lambda: check_key(None, []), "key=None must be an AnswerKey"),
]


@pytest.mark.parametrize("call, message", BAD_CALLS, ids=[m.split(" ")[0] for _, m in BAD_CALLS])
def test_a_wrong_type_is_a_config_error_naming_the_argument(call, message):
    with pytest.raises(ConfigError) as err:
        call()
    assert str(err.value).startswith(message), str(err.value)


def test_unknown_names_are_still_unknown_quantity_errors():
    with pytest.raises(UnknownQuantityError, match="did you mean pp.bubble_fraction.gpipe"):
        closed_form.get("pp.bubble_fraction.gpipee")
    with pytest.raises(UnknownQuantityError, match="did you mean memory.train_state_bytes"):
        quantities.get_quantity("memory.train_stat_bytes")


def _scalar_inputs():
    for name, q in quantities.quantities().items():
        for i in q.inputs:
            if i.kind not in ("vector", "matrix"):
                yield name, q, i


@pytest.mark.parametrize("sentinel", ["-1", '"-80 GB"'])
def test_a_negative_input_or_a_minus_one_sentinel_is_refused_for_every_quantity(sentinel):
    refused = 0
    for name, q, i in _scalar_inputs():
        if sentinel.startswith('"') and i.unit != "bytes":
            continue
        text = (f'{META}\n[[claim]]\nid = "a"\nquantity = "{name}"\ninputs = {{ {i.name} = {sentinel} }}\n'
                f'claimed = 1\nunit = "{q.unit}"\n')
        with pytest.raises(AnswerKeyError, match=rf"\[claim\[0\] \(a\)\.inputs\.{i.name}\] {i.name}=-"):
            keys.parse_key(text, "k.toml")
        refused += 1
    assert refused > (100 if sentinel == "-1" else 20)


def test_a_reference_to_a_negative_figure_is_refused_not_judged():
    text = (f'{META}\n[[claim]]\nid = "neg"\nquantity = "reported.fact"\nclaimed = -5\nunit = "GB"\n'
            '\n[[claim]]\nid = "f"\nquantity = "memory.fits"\ninputs = { total_bytes = "@neg", gpu_bytes = "80 GB" }\n'
            'claimed = true\nunit = "flag"\n')
    # the negative figure itself is refused when the key is read, before any claim refers to it
    with pytest.raises(AnswerKeyError, match=r"k.toml:\d+: \[claim\[0\] \(neg\).claimed\] claimed=-5 GB is negative: "
                                             r"a size or a count is >= 0"):
        keys.parse_key(text, "k.toml")
    # a reference to a figure that is not a size (a plain value) meets the input's domain when audited
    text = text.replace('unit = "GB"', 'unit = "value"').replace('"@neg", gpu_bytes', '"@neg", gpu_bytes')
    key = keys.parse_key(text, "k.toml")
    with pytest.raises(AnswerKeyError, match=r"k.toml:\d+: \[claim\[1\] \(f\).inputs.total_bytes"):
        verdict.audit_key(key)


def test_golden_verify_reports_a_malformed_key_as_one_failing_row(tmp_path: Path):
    (tmp_path / "bad.toml").write_text("not toml [")
    (row,) = golden.verify(tmp_path / "bad.toml")
    assert row.verdict == "FAIL" and row.detail.startswith(f"{tmp_path / 'bad.toml'}:1: not valid TOML")
