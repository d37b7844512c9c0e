"""Package discovery that pyproject.toml cannot state alone.

golden/ stays at the top of the repository, the one copy of the answer keys; the wheel ships it
inside the package as ``distcheck.golden_keys`` (read by :mod:`distcheck.golden`). Every other
package is found by walking ``distcheck/``, so a new package needs no entry here.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["distcheck", "distcheck.*"]), "distcheck.golden_keys"],
    package_dir={"distcheck.golden_keys": "golden"},
)
