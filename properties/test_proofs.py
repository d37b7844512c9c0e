"""sympy proofs (distcheck.props.prove, distcheck.props.PROOFS), plus the GPipe derivation spelled out here."""

import pytest
import sympy as sp

from distcheck.props import PROOFS, prove


@pytest.mark.parametrize("name", sorted(PROOFS))
def test_proof_holds(name):
    result = prove(name)
    assert result.verdict == "pass", result.detail
    assert result.backend == "sympy"


def test_gpipe_bubble_simplifies():
    p, m = sp.symbols("p m", integer=True, positive=True)
    total = 3 * (m + p - 1)  # forward 1 tick + backward 2 ticks per stage (lesson)
    assert sp.simplify(1 - 3 * m / total - (p - 1) / (m + p - 1)) == 0
    x = (p - 1) / m
    assert sp.simplify(x / (1 + x) - (p - 1) / (m + p - 1)) == 0
    assert sp.limit((p - 1) / (m + p - 1), m, sp.oo) == 0


def test_a_false_identity_is_not_proved(monkeypatch):
    from distcheck.engine import proofs as pr

    monkeypatch.setitem(pr.PROOFS, "proof.bogus", lambda: (sp.simplify(sp.Symbol("p") - 1) == 0, "p - 1"))
    assert prove("proof.bogus").verdict == "FAIL"


@pytest.mark.parametrize("name", ["pp.bubble_fraction.gpipe", "pp.bubble_ratio.interleaved",
                                  "zero.bytes_per_gpu.stage3", "zero.comm_elements_per_rank.stage3",
                                  "params.decoder_only"])
def test_proof_symbols_are_positive_integers(name):
    # the proofs simplify under these assumptions: p, m, v, ticks, Psi, N_d, sizes > 0 integers
    from distcheck.closed_form import get

    form = get(name)
    flags = {"swiglu", "tied", "norm_weights", "norm_biases", "qkv_bias", "mlp_bias", "out_bias", "final_norm", "k"}
    for key, sym in form.symbols.items():
        if key in flags:
            continue
        assert sym.is_integer and sym.is_positive, f"{name}: {key} must be declared a positive integer"


def test_the_four_named_identities_are_proved():
    # issue 3 names four: 1 - busy/total = (p-1)/(m+p-1), fraction = x/(1+x),
    # ZeRO stages = baseline at N = 1, bubble -> 0 as m -> oo
    for name in ("proof.pp.gpipe_bubble", "proof.pp.conventions", "proof.zero.baseline_at_one",
                 "proof.pp.bubble_vanishes"):
        result = prove(name)
        assert result.verdict == "pass", (name, result.detail)
    assert prove("proof.pp.gpipe_bubble").detail == "1 - busy/total = (p - 1)/(m + p - 1)"
