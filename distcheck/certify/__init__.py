"""Certify a user's own distributed-training code on a real torch.distributed world.

    from distcheck.certify import certify

    result = certify("mypkg.layers:MyRowParallel", contract="row-parallel-linear", world_sizes=[2, 4])
    result.assert_certified()          # raises CertificationFailed with the shrunk counterexample

or ``distcheck certify mypkg.layers:MyRowParallel --contract row-parallel-linear`` (see
docs/CERTIFY.md). A *contract* (:class:`Contract`) holds the cases sized to the world, the rank
function, the reference, the cross-rank checks, the collectives expected and the exactness
regime; the engine (:func:`certify`) drives Hypothesis in the parent and runs every example on
every rank of a persistent pool.

Importing this package does not import torch; the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "certify",
    "Certification",
    "Certificate",
    "PropertyVerdict",
    "Contract",
    "PropertySpec",
    "Option",
    "Outcome",
    "contracts",
    "get_contract",
    "register_contract",
    "ProtocolError",
    "TargetError",
    "CertificationFailed",
    "load_config",
    "config_rows",
]

_WHERE = {
    "certify": "engine",
    "Certification": "certificate", "Certificate": "certificate", "PropertyVerdict": "certificate",
    "Contract": "contract", "PropertySpec": "contract", "Option": "contract", "Outcome": "contract",
    "contracts": "contract", "get_contract": "contract", "register_contract": "contract",
    "ProtocolError": "errors", "TargetError": "errors", "CertificationFailed": "errors",
    "load_config": "config", "config_rows": "config",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"distcheck.certify.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'distcheck.certify' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
