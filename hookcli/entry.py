"""The console script and ``python -m hookcli``: the guarding parent first (where it
applies, hookcli/exitguard.py), then the CLI in the child.

The herald (the function that tells the parent a pass, with its token) goes straight
into ``cli.main``: no module attribute of hookcli's holds it.
"""

import sys


def main() -> None:
    from hookcli import exitguard

    herald = exitguard.guard() if exitguard.should_guard(sys.argv[1:]) else None  # forks
    from hookcli.cli import main as cli_main

    cli_main(herald)
