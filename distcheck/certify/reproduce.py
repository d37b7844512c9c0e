"""The ``distcheck certify`` command line that replays one run of :func:`distcheck.certify.certify`."""

from __future__ import annotations

__all__ = ["reproduce_command", "LOCAL_BACKEND"]

#: the backend name of a world of one rank in the certifying process (``LocalWorld``): no ``--backend`` to replay
LOCAL_BACKEND = "local"


def reproduce_command(ref: str, contract: str, *, world_size: int | None, backend: str, seed: int, profile: str,
                      examples: int | None, dtype: str | None, options: dict, launcher: str = "local",
                      importable: bool = True, batch: int = 1) -> str:
    """The ``distcheck certify`` command line that replays one run (one world size, one dtype).

    A target with no ``module:object`` name (an object built in a test) is replayed by the
    equivalent :func:`certify` call instead.
    """
    import json
    import shlex

    if not importable:
        return (f"certify(<the object {ref}>, contract={contract!r}, world_sizes=[{world_size}], backend={backend!r}, "
                f"seed={seed}, profile={profile!r}, examples={examples!r}, dtypes=[{dtype!r}], options={options!r}, "
                f"batch={batch})")
    parts = ["distcheck", "certify", ref, "--contract", contract]
    if launcher == "torchrun":
        parts = ["torchrun", "--standalone", f"--nproc-per-node={world_size}", "-m", *parts, "--launcher", "torchrun"]
    elif world_size is not None and backend != LOCAL_BACKEND:  # a world-free contract runs in the process
        parts += ["--world-sizes", str(world_size)]
    if backend != LOCAL_BACKEND:
        parts += ["--backend", backend]
    parts += ["--seed", str(seed), "--profile", profile]
    if examples is not None:
        parts += ["--examples", str(examples)]
    if batch != 1:
        parts += ["--batch", str(batch)]
    if dtype is not None:
        parts += ["--dtypes", dtype]
    for key, value in sorted(options.items()):
        if isinstance(value, dict):
            text = json.dumps(value)
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
        parts += ["--option", f"{key}={text}"]
    return " ".join(shlex.quote(p) for p in parts)
