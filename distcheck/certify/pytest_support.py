"""pytest support for certifying layers in a test suite: options, the ``world_size`` marker, and
session-scoped rank pools. Loaded by :mod:`distcheck.pytest_plugin`; imports only pytest and the
standard library, so nothing heavy (torch) is imported until a fixture starts a pool.

Options (group ``distcheck``):

* ``--distcheck-world-sizes=2,4``: world sizes of tests that use ``rank_pool`` or ``world_size``
  without a marker (default 2);
* ``--distcheck-backend=gloo|threaded|nccl``: the pools' backend (default gloo);
* ``--distcheck-examples=N`` and ``--distcheck-seed=S``: passed to certifications made through the
  ``distcheck_certify`` fixture;
* ``--distcheck-timeout=SECONDS``: a step's timeout on the pools (default 120).

Marker: ``@pytest.mark.world_size(2, 4, backend="threaded")`` runs the test once per world size
(ids ``ws2``, ``ws4``); ``backend`` is its only keyword, anything else is a collection error.

Fixtures:

* ``rank_pool`` (session): a started :class:`~distcheck.runners.RankPool` of the test's world size
  and backend. One pool per (world size, backend) lives for the whole session, shared by every
  test that asks for it, and is closed at the end (``distcheck_pools``). A backend this machine
  cannot run (NCCL without enough GPUs) skips the test, decided before anything starts.
* ``world_size`` (session): the test's world size.
* ``distcheck_certify``: ``certify(target, contract, **kwargs)`` with ``pool=rank_pool`` and the
  command line's examples and seed filled in; returns the Certification (call
  ``.assert_certified()`` on it). A certification in which no property could fail (a world
  below the contract's smallest: ``world_size(1)`` on a tensor-parallel contract) skips the
  test with the reason instead; it never passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from distcheck.certify.certificate import Certification
    from distcheck.engine.contracts.contract import Contract
    from distcheck.runners.pool import RankPool

__all__ = ["MARKER", "add_options", "configure", "generate_tests", "distcheck_pools", "distcheck_world",
           "world_size", "rank_pool", "distcheck_certify"]

MARKER = "world_size"
_MARKER_HELP = (f"{MARKER}(*sizes, backend=None): run the test once per world size, with the rank_pool and "
                "world_size fixtures of distcheck")
_KEYWORDS = ("backend",)
_BACKENDS = ("gloo", "threaded", "nccl")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise pytest.UsageError(f"--distcheck-world-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise pytest.UsageError(f"--distcheck-world-sizes must be integers >= 1, got {text!r}")
    return sizes


def add_options(group: pytest.OptionGroup) -> None:
    """Add the ``--distcheck-*`` pool and certification options to the plugin's option group."""
    group.addoption("--distcheck-world-sizes", default="2", metavar="N[,N...]",
                    help="world sizes of tests using rank_pool/world_size without a world_size marker (default 2)")
    group.addoption("--distcheck-backend", default="gloo", choices=_BACKENDS,
                    help="backend of the rank pools (default gloo)")
    group.addoption("--distcheck-examples", default=None, type=int, metavar="N",
                    help="Hypothesis examples per property for distcheck_certify (default: the profile's)")
    group.addoption("--distcheck-seed", default=None, type=int, metavar="SEED",
                    help="Hypothesis seed for distcheck_certify (default: drawn and reported)")
    group.addoption("--distcheck-timeout", default=120.0, type=float, metavar="SECONDS",
                    help="timeout of one step on a rank pool (default 120)")


def configure(config: pytest.Config) -> None:
    """Register the ``world_size`` marker and check the option values."""
    config.addinivalue_line("markers", _MARKER_HELP)
    _sizes(config.getoption("--distcheck-world-sizes", default="2"))


def generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize tests that use ``rank_pool``/``world_size`` over (world size, backend)."""
    marker = metafunc.definition.get_closest_marker(MARKER)
    # only tests whose fixtures reach this plugin's (a suite's own `world_size` fixture or a
    # directly parametrized `world_size` argument is left alone)
    direct = {m.args[0] for m in metafunc.definition.iter_markers("parametrize") if m.args}
    uses = "distcheck_world" in metafunc.fixturenames and not any("world_size" in str(a) for a in direct)
    if marker is None and not uses:
        return
    config = metafunc.config
    backend = config.getoption("--distcheck-backend", default="gloo")
    if marker is not None:
        unknown = sorted(set(marker.kwargs) - set(_KEYWORDS))
        if unknown:
            raise TypeError(f"@pytest.mark.{MARKER} takes world sizes and backend=, not {', '.join(unknown)} "
                            f"({metafunc.definition.nodeid})")
        sizes = list(marker.args)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise TypeError(f"@pytest.mark.{MARKER} needs world sizes that are integers >= 1, got {sizes!r} "
                            f"({metafunc.definition.nodeid})")
        backend = marker.kwargs.get("backend", backend)
        if backend not in _BACKENDS:
            raise TypeError(f"@pytest.mark.{MARKER}: backend={backend!r} must be one of {', '.join(_BACKENDS)}")
        if not uses:
            raise TypeError(f"a test marked {MARKER} must use the rank_pool or world_size fixture "
                            f"({metafunc.definition.nodeid})")
    else:
        sizes = _sizes(config.getoption("--distcheck-world-sizes", default="2"))
    default_backend = config.getoption("--distcheck-backend", default="gloo")
    ids = [f"ws{n}" + ("" if backend == default_backend else f"-{backend}") for n in sizes]
    metafunc.parametrize("distcheck_world", [(n, backend) for n in sizes], ids=ids, indirect=True, scope="session")


class _Pools:
    """One started pool per (world size, backend), closed at session end."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.pools: dict[tuple[int, str], RankPool] = {}

    def get(self, world_size: int, backend: str) -> RankPool:
        key = (world_size, backend)
        if key not in self.pools:
            from distcheck.core.errors import BackendUnavailable
            from distcheck.runners import RankPool

            try:
                pool = RankPool(world_size, backend=backend, timeout_s=self.timeout_s)
            except BackendUnavailable as exc:
                pytest.skip(f"backend {backend!r} cannot run {world_size} ranks here: {exc}")
            self.pools[key] = pool.start()
        return self.pools[key]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()


@pytest.fixture(scope="session")
def distcheck_pools(request: pytest.FixtureRequest) -> Iterator[_Pools]:
    """The session's rank pools (see :class:`_Pools`)."""
    pools = _Pools(request.config.getoption("--distcheck-timeout", default=120.0))
    yield pools
    pools.close()


@pytest.fixture(scope="session")
def distcheck_world(request: pytest.FixtureRequest) -> tuple[int, str]:
    """``(world_size, backend)`` of the test (parametrized by the marker or the options)."""
    return request.param


@pytest.fixture(scope="session")
def world_size(distcheck_world: tuple[int, str]) -> int:
    """The test's world size."""
    return distcheck_world[0]


@pytest.fixture(scope="session")
def rank_pool(distcheck_world: tuple[int, str], distcheck_pools: _Pools) -> RankPool:
    """A started RankPool of the test's world size and backend, shared for the whole session."""
    return distcheck_pools.get(*distcheck_world)


@pytest.fixture
def distcheck_certify(rank_pool: RankPool, request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``certify(target, contract, **kwargs)`` on ``rank_pool`` with the command line's examples and seed."""
    from distcheck.certify.engine import certify

    config = request.config
    defaults = {"pool": rank_pool, "examples": config.getoption("--distcheck-examples", default=None),
                "seed": config.getoption("--distcheck-seed", default=None)}
    profile = _selected_profile(config)
    if profile is not None:
        defaults["profile"] = profile

    @functools.wraps(certify)
    def run(target: Any, contract: str | Contract, **kwargs: Any) -> Certification:
        cert = certify(target, contract, **{**{k: v for k, v in defaults.items() if v is not None}, **kwargs})
        if not cert.can_fail:  # nothing here can fail (a world below the contract's smallest): skip, never pass
            from distcheck.certify.certificate import NOTHING_CAN_FAIL

            pytest.skip(f"{cert.target} under {cert.contract}: {NOTHING_CAN_FAIL} ({'; '.join(cert.skip_reasons())})")
        return cert

    return run


def _selected_profile(config: Any) -> str | None:
    """The distcheck profile the plugin made current (None when the user chose a foreign one)."""
    from hypothesis import settings

    from distcheck.engine.profiles import PROFILES

    current = settings.get_current_profile_name()
    return current if current in PROFILES else None
