"""Errors of the certification engine.

* :class:`ProtocolError` (a ConfigError, so bad input: exit code 2): the target
  does not implement the contract's protocol (no ``weight``, a constructor that
  does not take the contract's arguments, a forward that returns no tensor).
  Raised in the parent when it can be decided there, or on a rank while the
  target is built; either way the certification stops, no property is judged.
* :class:`TargetError` (a ConfigError): ``module:object`` cannot be imported.
* :class:`CertificationFailed` (an AssertionError): raised by
  :meth:`~distcheck.certify.certificate.Certification.assert_certified` with
  every failing property's full counterexample; :class:`NothingCanFail` (one of them) when no
  property was able to fail (every verdict a skip: a world below the contract's smallest).
"""

from __future__ import annotations

from distcheck.core.errors import ConfigError, DistcheckError

__all__ = ["ProtocolError", "TargetError", "CertificationFailed", "NothingCanFail"]


class ProtocolError(ConfigError):
    """The target does not follow the contract's protocol (field = the target, rule = what is missing)."""


class TargetError(ConfigError):
    """A ``module:object`` target that cannot be imported or resolved."""


class CertificationFailed(DistcheckError, AssertionError):
    """A certification has a failing property; the message holds every failure in full."""


class NothingCanFail(CertificationFailed):
    """A certification in which no property was able to fail (every verdict a skip, each with its reason):
    nothing was certified. distcheck's pytest plugin turns it into a skip of the test."""
