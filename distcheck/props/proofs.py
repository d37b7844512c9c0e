"""Deprecated (goes in the next release): the proofs are :func:`distcheck.props.prove`,
:func:`distcheck.props.prove_all` and :data:`distcheck.props.PROOFS`.

Every name this module served still resolves, with a DeprecationWarning naming its path.
"""

from typing import Any

from distcheck.core.face import moved


def _where(name: str) -> tuple[str, Any] | None:
    import distcheck.props as props

    return (f"distcheck.props.{name}", getattr(props, name)) if name in ("PROOFS", "prove", "prove_all") else None


__getattr__ = moved(__name__, _where, "distcheck.props")
