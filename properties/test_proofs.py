"""sympy proofs (distcheck.props.proofs), plus the GPipe derivation spelled out here."""

import pytest
import sympy as sp

from distcheck.props.proofs import PROOFS, prove


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
    import distcheck.props.proofs as pr

    monkeypatch.setitem(pr.PROOFS, "proof.bogus", lambda: (sp.simplify(sp.Symbol("p") - 1) == 0, "p - 1"))
    assert prove("proof.bogus").verdict == "FAIL"
