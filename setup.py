"""Package discovery for setuptools (the rest of the metadata is in pyproject.toml).

Every package under ``distcheck/`` is found, so a new package (a parallelism package under
``distcheck/parallel/``) ships without an edit; the golden keys ship as ``distcheck.golden_keys``,
mapped from the repository's one ``golden/`` folder by ``package-dir`` in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["distcheck", "distcheck.*"]), "distcheck.golden_keys"])
