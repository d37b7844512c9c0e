"""Megatron-core: ``RankGenerator`` (rank-layout contract) and the theoretical memory (memory contract).

``megatron.core.parallel_state.RankGenerator(tp, ep, dp, pp, cp, order)`` gives the rank
groups of any token of its order (``get_ranks("tp-pp")``). ``initialize_model_parallel``
builds two: the dense one (ep = 1) and the expert one (expert tp etp, ep, expert dp =
world / (etp ep pp), cp = 1), under the same order. The adapter draws degrees (etp and ep
splitting the tp*cp*dp ranks of a stage) and a permutation of ``tp-cp-ep-dp-pp`` and compares every token below with distcheck's layout:
:class:`distcheck.layout.ParallelConfig` for the single dense axes (and for ep under the
default order with etp = tp, where Megatron carves ep from the dp*cp ranks like distcheck's
``ep_placement="inside_dp"``), :func:`distcheck.mesh_layout.megatron_layout` for groups
spanning several axes and for the expert layout under other orders.

The theoretical memory (``megatron/training/theoretical_memory_usage.py``) lives in the
``megatron.training`` package of the Megatron-LM repository; the adapter imports it where
it exists.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from distcheck.libs.badinput import Probe, check_bad_input
from distcheck.libs.layouts import LayoutTarget, check_layout
from distcheck.libs.targets import dist_version
from distcheck.report import FAIL, CheckResult

DIST = "megatron-core"
TITLE = "Megatron-core RankGenerator; theoretical memory"
CONTRACT = "rank layout; memory estimator"

DENSE_TOKENS = ("tp", "cp", "dp", "pp", "tp-pp", "dp-cp", "tp-cp", "tp-dp-cp", "tp-dp-cp-pp")
EXPERT_TOKENS = ("ep", "tp", "dp", "tp-ep", "tp-ep-pp")
ORDERS = tuple("-".join(p) for p in itertools.permutations(("tp", "cp", "ep", "dp", "pp")))
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _configs():
    def with_ep(base):
        # expert tp (etp) and ep split the tp*cp*dp ranks of a stage: etp*ep must divide them
        ranks = base["tp"] * base["cp"] * base["dp"]
        return st.sampled_from(_divisors(ranks)).flatmap(
            lambda etp: st.sampled_from(_divisors(ranks // etp)).map(lambda ep: dict(base, etp=etp, ep=ep)))

    # ORDERS[0] is the default order: Hypothesis shrinks sampled_from towards its first element
    base = st.fixed_dictionaries({"tp": st.integers(1, 4), "cp": st.integers(1, 3), "dp": st.integers(1, 4),
                                  "pp": st.integers(1, 3), "order": st.sampled_from(ORDERS)})
    return base.flatmap(with_ep)


def _groups(cfg: dict) -> dict:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.parallel_state import RankGenerator
    tp, cp, dp, pp, ep, etp, order = (cfg[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp", "order"))
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=(tp * cp * dp * pp) // (etp * ep * pp), pp=pp, cp=1, order=order)
    out = {t: dense.get_ranks(t) for t in DENSE_TOKENS}
    out.update({f"expert:{t}": expert.get_ranks(t) for t in EXPERT_TOKENS})
    return out


def _reference(cfg: dict) -> dict:
    from distcheck.layout import ParallelConfig, groups
    from distcheck.mesh_layout import megatron_layout

    tp, cp, dp, pp, ep, etp, order = (cfg[k] for k in ("tp", "cp", "dp", "pp", "ep", "etp", "order"))
    mine = megatron_layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, dp=dp, order=order)
    dense = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, order=order)  # ep = 1: a size-1 axis of the order
    out = {t: groups(dense, t) for t in ("tp", "cp", "dp", "pp")}
    out.update({t: mine.groups(t) for t in DENSE_TOKENS if "-" in t})
    out.update({f"expert:{t}": mine.groups(t, expert=True) for t in EXPERT_TOKENS})
    if order == DEFAULT_ORDER and etp == tp:  # Megatron's default placement is distcheck's ep carved from dp*cp
        out["expert:ep"] = groups(ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, order=order), "ep")
    return out


def layout_target() -> LayoutTarget:
    return LayoutTarget("megatron.rank_generator", f"{DIST} {dist_version(DIST)}", _configs(), _groups, _reference,
                        lambda c: c["order"])


PROBES = (
    Probe("tp=0", "RankGenerator(tp=0, ep=1, dp=2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('dp')"),
    Probe("tp=-1", "RankGenerator(tp=-1, ep=1, dp=2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('dp')"),
    Probe("dp=-2", "RankGenerator(tp=2, ep=1, dp=-2, pp=1, cp=1, order='tp-cp-ep-dp-pp').get_ranks('tp')"),
    Probe("order 'tp-tp-dp' (repeated axis)", "RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-tp-dp').get_ranks('dp')"),
    Probe("ep=2 with cp=2", "RankGenerator(tp=1, ep=2, dp=2, pp=1, cp=2, order='tp-cp-ep-dp-pp').get_ranks('ep')"),
    Probe("order 'tp-xp-dp' (unknown axis)", "RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order='tp-xp-dp').get_ranks('dp')"),
)
SETUP = "from megatron.core.parallel_state import RankGenerator"


def memory_row() -> CheckResult:
    """``libs.megatron.theoretical_memory.import``: whether the theoretical-memory module imports."""
    lib = f"{DIST} {dist_version(DIST)}"
    try:
        import megatron.training.theoretical_memory_usage  # noqa: F401
    except ImportError as exc:
        return CheckResult(check="libs.megatron.theoretical_memory.import", backend=lib, verdict=FAIL,
                           detail=f"cannot import megatron.training.theoretical_memory_usage: "
                                  f"{type(exc).__name__}: {exc}", extra={"contract": "memory-estimator"})
    return CheckResult(check="libs.megatron.theoretical_memory.import", backend=lib, verdict=FAIL,
                       detail="megatron.training.theoretical_memory_usage imports: its estimator (which takes "
                              "Megatron-LM's argument namespace) has no adapter yet; see docs/LIBRARIES.md",
                       extra={"contract": "memory-estimator"})


def rows(max_examples: int, seed: int):
    lib = f"{DIST} {dist_version(DIST)}"
    return [check_layout(layout_target(), max_examples=max_examples, seed=seed),
            check_bad_input("megatron.rank_generator", lib, SETUP, PROBES),
            memory_row()]
