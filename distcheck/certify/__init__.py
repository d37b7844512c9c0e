"""Certify a user's own distributed-training code on a real torch.distributed world.

    from distcheck.certify import certify

    result = certify("mypkg.layers:MyRowParallel", contract="row-parallel-linear", world_sizes=[2, 4])
    result.assert_certified()          # raises CertificationFailed with the shrunk counterexample

or ``distcheck certify mypkg.layers:MyRowParallel --contract row-parallel-linear`` (see
docs/CERTIFY.md). A *contract* (:class:`Contract`) holds the cases sized to the world, the rank
function, the reference, the cross-rank checks, the collectives expected and the exactness
regime; the engine (:func:`certify`) drives Hypothesis in the parent and runs every example on
every rank of a persistent pool. The contract machinery is :mod:`distcheck.engine.contracts`
and the contracts live with their parallelism (``distcheck/parallel/<name>/contracts.py``);
this package is the engine, the certificate, the ``[tool.distcheck]`` configuration, the
command line and the pytest support, and keeps the public names below.

Importing this package does not import torch; the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Certificate",
    "Certification",
    "CertificationFailed",
    "Contract",
    "Option",
    "Outcome",
    "PropertySpec",
    "PropertyVerdict",
    "ProtocolError",
    "TargetError",
    "certify",
    "config_rows",
    "contracts",
    "get_contract",
    "load_config",
    "register_contract",
]

_WHERE = {
    "certify": "distcheck.certify.engine",
    "Certification": "distcheck.certify.certificate", "Certificate": "distcheck.certify.certificate",
    "PropertyVerdict": "distcheck.certify.certificate",
    "Contract": "distcheck.engine.contracts.contract", "PropertySpec": "distcheck.engine.contracts.contract",
    "Option": "distcheck.engine.contracts.contract", "Outcome": "distcheck.engine.contracts.contract",
    "contracts": "distcheck.engine.contracts.contract", "get_contract": "distcheck.engine.contracts.contract",
    "register_contract": "distcheck.engine.contracts.contract",
    "ProtocolError": "distcheck.engine.contracts.errors", "TargetError": "distcheck.engine.contracts.errors",
    "CertificationFailed": "distcheck.engine.contracts.errors",
    "load_config": "distcheck.certify.config", "config_rows": "distcheck.certify.config",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'distcheck.certify' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
