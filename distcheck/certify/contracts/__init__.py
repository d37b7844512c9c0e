"""The contracts, one module per parallelism; :func:`distcheck.certify.contract.contracts` finds
every :class:`~distcheck.certify.contract.Contract` subclass defined here by walking this package."""
