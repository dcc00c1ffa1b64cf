"""The torch matrix: the test suite in one virtual environment per torch/torchvision pair.

    make matrix            # every pair, the fast suite (what `make test` runs), at 1 and 2 threads
    make matrix-zoo        # every pair, the torchvision zoo and cost's published MACs
    .venv/bin/nox -s "tests(torch='2.15.0')"   # one pair
    THREADS=1 .venv/bin/nox -s "tests(torch='2.15.0')"   # one pair, one thread count

The pairs are the floor that pyproject.toml declares, this machine's pair and the
newest on the registry. Each session's venv lives in .nox/ and is reused
(``-R``/``--reuse-existing-virtualenvs`` is the default here).
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

# (torch, torchvision, why this pair is in the matrix)
PAIRS = [
    ("2.6.0", "0.21.0", "the floor: transformers 5 (the hf extra) needs torch >= 2.6"),
    ("2.14.1", "0.29.1", "the pair a default install resolves on the project's machines"),
    ("2.15.0", "0.29.2", "the newest pair on the registry"),
]
TORCH = [p[0] for p in PAIRS]
VISION = {p[0]: p[1] for p in PAIRS}


def _install(session: nox.Session, torch: str) -> None:
    env: dict[str, str] = {}
    if torch == PAIRS[-1][0]:
        # A machine-wide pip configuration may cap torch below the newest release
        # (`pip install --isolated` still reads the site-wide file): read no
        # configuration file at all for this pair, and take it from the registry.
        env["PIP_CONFIG_FILE"] = os.devnull
    session.install(f"torch=={torch}", f"torchvision=={VISION[torch]}", "-e", ".[dev]", env=env)
    session.run(
        "python",
        "-c",
        "import torch, torchvision; print('torch', torch.__version__, "
        "'torchvision', torchvision.__version__)",
    )


@nox.session
@nox.parametrize("torch", TORCH)
def tests(session: nox.Session, torch: str) -> None:
    """The fast suite (`make test`'s) on one torch, twice: torch's intra-op pool at 1
    thread, then at 2 (OMP_NUM_THREADS). Reductions accumulate in another order on each,
    and the suite must not depend on which. ``THREADS=1`` in the environment runs one."""
    _install(session, torch)
    for threads in os.environ.get("THREADS", "1 2").split():
        session.log(f"the fast suite at OMP_NUM_THREADS={threads}")
        session.run(
            "python",
            "-m",
            "pytest",
            "-q",
            "-m",
            "not slow and not browser and not real",
            "-p",
            "no:cacheprovider",
            "-n",
            os.environ.get("JOBS", "2"),
            "--dist",
            "loadfile",
            "--ignore=tests/real",
            *session.posargs,
            env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads},
        )


@nox.session
@nox.parametrize("torch", TORCH)
def zoo(session: nox.Session, torch: str) -> None:
    """`make zoo` on one torch: inspect on every torchvision model, cost's MACs against
    torchvision's published figures for every classification weight."""
    _install(session, torch)
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "-m",
        "slow",
        "-p",
        "no:cacheprovider",
        "tests/test_zoo.py",
        "tests/test_cost_zoo.py",
        *session.posargs,
    )
