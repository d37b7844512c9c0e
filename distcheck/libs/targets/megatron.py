"""Megatron-core: ``RankGenerator`` (rank-layout and bad-input contracts) and the theoretical memory.

``megatron.core.parallel_state.RankGenerator(tp, ep, dp, pp, cp, order)`` gives the rank
groups of any token of its order (``get_ranks("tp-pp")``). ``initialize_model_parallel``
builds two: the dense one (ep = 1) and the expert one (expert tp etp, ep, expert dp =
world / (etp ep pp), cp = 1), under the same order. The adapter draws degrees (etp and ep
splitting the tp*cp*dp ranks of a stage) and a permutation of ``tp-cp-ep-dp-pp`` and compares
every token below with distcheck's layout: :class:`distcheck.parallel.layout.ParallelConfig` for the
single dense axes (and for ep under the default order with etp = tp, where Megatron carves ep
from the dp*cp ranks like distcheck's ``ep_placement="inside_dp"``),
:func:`distcheck.parallel.layout.megatron_layout` for groups spanning several axes and for the expert
layout under other orders.

The theoretical memory (``megatron/training/theoretical_memory_usage.py``) lives in the
``megatron.training`` package of the Megatron-LM repository, which the megatron-core wheel
does not ship: :func:`extra_rows` gives its row, a skip naming what to install when it does
not import (never a finding: :func:`distcheck.engine.findings.not_loaded`).

    distcheck certify distcheck.libs.targets.megatron:RANK_GENERATOR --contract rank-layout
    distcheck certify distcheck.libs.targets.megatron:BAD_INPUT --contract bad-input
"""

from __future__ import annotations

import itertools
from typing import Any

from distcheck.core.vocab import Axis
from distcheck.parallel.layout.contracts import LayoutTarget, Probe, ProbeSet
from distcheck.report import SKIP, CheckResult

__all__ = ["DIST", "TITLE", "CERTIFY", "RANK_GENERATOR", "BAD_INPUT", "extra_rows"]

DIST = "megatron-core"
TITLE = "Megatron-core RankGenerator; theoretical memory"

_TP, _CP, _EP, _DP, _PP = Axis.TP, Axis.CP, Axis.EP, Axis.DP, Axis.PP
#: the tokens compared on the dense layout (single axes and groups spanning several)
DENSE_TOKENS = tuple("-".join(t) for t in ((_TP,), (_CP,), (_DP,), (_PP,), (_TP, _PP), (_DP, _CP), (_TP, _CP),
                                           (_TP, _DP, _CP), (_TP, _DP, _CP, _PP)))
#: the tokens compared on the expert layout
EXPERT_TOKENS = tuple("-".join(t) for t in ((_EP,), (_TP,), (_DP,), (_TP, _EP), (_TP, _EP, _PP)))
#: every order of the five axes; the first is Megatron-core's default, tp-cp-ep-dp-pp (Hypothesis shrinks to it)
ORDERS = tuple("-".join(p) for p in itertools.permutations((_TP, _CP, _EP, _DP, _PP)))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _with_ep(base: dict[str, Any]) -> Any:
    from hypothesis import strategies as st

    # expert tp (etp) and ep split the tp*cp*dp ranks of a stage: etp*ep must divide them
    ranks = base["tp"] * base["cp"] * base["dp"]
    return st.sampled_from(_divisors(ranks)).flatmap(
        lambda etp: st.sampled_from(_divisors(ranks // etp)).map(lambda ep: dict(base, etp=etp, ep=ep)))


def _configs() -> Any:
    from hypothesis import strategies as st

    base = st.fixed_dictionaries({"tp": st.integers(1, 4), "cp": st.integers(1, 3), "dp": st.integers(1, 4),
                                  "pp": st.integers(1, 3), "order": st.sampled_from(ORDERS)})
    return base.flatmap(_with_ep)


def _degrees(cfg: dict) -> tuple:
    return tuple(cfg[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp", "order"))


def _groups(cfg: dict) -> dict:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.parallel_state import RankGenerator
    tp, cp, dp, pp, ep, etp, order = _degrees(cfg)
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=(tp * cp * dp * pp) // (etp * ep * pp), pp=pp, cp=1, order=order)
    out = {t: dense.get_ranks(t) for t in DENSE_TOKENS}
    out.update({f"expert:{t}": expert.get_ranks(t) for t in EXPERT_TOKENS})
    return out


def _reference(cfg: dict) -> dict:
    from distcheck.parallel.layout import MEGATRON_DEFAULT_ORDER, ParallelConfig, groups, megatron_layout

    tp, cp, dp, pp, ep, etp, order = _degrees(cfg)
    mine = megatron_layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, dp=dp, order=order)
    dense = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, order=order)  # ep = 1: a size-1 axis of the order
    out: dict[str, list[list[int]]] = {t.value: groups(dense, t) for t in (_TP, _CP, _DP, _PP)}
    out.update({t: mine.groups(t) for t in DENSE_TOKENS if "-" in t})
    out.update({f"expert:{t}": mine.groups(t, expert=True) for t in EXPERT_TOKENS})
    # Megatron's default placement is distcheck's ep carved from dp*cp
    if order == MEGATRON_DEFAULT_ORDER and etp == tp:
        out[f"expert:{_EP}"] = groups(ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, order=order), _EP)
    return out


def _order(cfg: dict) -> str:
    return cfg["order"]


RANK_GENERATOR = LayoutTarget("megatron.rank_generator", DIST, _configs, _groups, _reference, _order)

BAD_INPUT = ProbeSet("megatron.rank_generator", DIST, "from megatron.core.parallel_state import RankGenerator", (
    Probe("tp=0", "RankGenerator(tp=0, ep=1, dp=2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('dp')"),
    Probe("tp=-1", "RankGenerator(tp=-1, ep=1, dp=2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('dp')"),
    Probe("dp=-2", "RankGenerator(tp=2, ep=1, dp=-2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('tp')"),
    Probe("order 'tp-tp-dp' (repeated axis)",
          "RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-tp-dp').get_ranks('dp')"),
    Probe("ep=2 with cp=2", "RankGenerator(tp=1, ep=2, dp=2, pp=1, cp=2, order='tp-cp-ep-dp-pp').get_ranks('ep')"),
    Probe("order 'tp-xp-dp' (unknown axis)",
          "RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-xp-dp').get_ranks('dp')"),
), valid=(
    Probe("tp=2, dp=2", "RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('dp')"),
))

#: the targets of this module and the contract each is certified under
CERTIFY = (("RANK_GENERATOR", "rank-layout"), ("BAD_INPUT", "bad-input"))


#: the module of Megatron's theoretical memory, and where it comes from (not the megatron-core wheel)
THEORETICAL_MEMORY = "megatron.training.theoretical_memory_usage"
MEGATRON_LM = "Megatron-LM from its repository (pip install git+https://github.com/NVIDIA/Megatron-LM)"


def extra_rows(*, required: bool = False) -> list[CheckResult]:
    """``libs.megatron.theoretical_memory.import``: Megatron's theoretical memory, which has no adapter.

    When :data:`THEORETICAL_MEMORY` does not import (the megatron-core wheel has no ``megatron.training``)
    the row is a skip naming what to install (:func:`distcheck.engine.findings.not_loaded`), even when
    ``required``: ``distcheck libs`` (without ``--allow-skips``) requires what the libs extra installs
    (megatron-core, which is installed here), and no PyPI distribution of the extra ships this module. When
    it imports, a skip: its estimator takes Megatron-LM's argument namespace and has no adapter, so nothing
    here is certified."""
    from importlib import import_module

    from distcheck.engine.findings import not_loaded
    from distcheck.libs.targets import library

    check, backend, extra = "libs.megatron.theoretical_memory.import", library(DIST), {"contract": "memory-estimator"}
    rows = [*ep_placement()]
    try:
        import_module(THEORETICAL_MEMORY)
    except ImportError as exc:
        return rows + [not_loaded(check, backend, THEORETICAL_MEMORY, exc, MEGATRON_LM, extra=extra)]
    return rows + [CheckResult(check=check, backend=backend, verdict=SKIP, extra=extra,
                               detail=(f"{THEORETICAL_MEMORY} imports, but its estimator (which takes Megatron-LM's "
                                       "argument namespace) has no adapter: nothing is certified; see "
                                       "docs/LIBRARIES.md"))]


def ep_placement() -> list[CheckResult]:
    """``libs.megatron.rank_generator.ep_placement``: the expert-parallel placement Megatron-core follows, named
    (:func:`distcheck.libs.targets.ep_placement_row`), from the expert ``RankGenerator`` of a 4-rank world with
    tp = etp = 2, ep = 2 (expert dp 1) under the default order."""
    import warnings

    from distcheck.libs.targets import ep_placement_row, library

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.parallel_state import RankGenerator
    call = "RankGenerator(tp=2, ep=2, dp=1, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('ep')"
    got = RankGenerator(tp=2, ep=2, dp=1, pp=1, cp=1, order="tp-cp-ep-dp-pp").get_ranks("ep")
    return [ep_placement_row("libs.megatron.rank_generator.ep_placement", library(DIST), got, tp=2, data=2, ep=2,
                             call=call)]
