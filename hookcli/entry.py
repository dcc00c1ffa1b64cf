"""The console script and ``python -m hookcli``: the guarding parent first (where it
applies, hookcli/exitguard.py), then the CLI in the child. ``hookcli watch`` first tries
its own parser (hookcli/watch/fastpath.py), which starts the training sooner.

The herald (the function that tells the parent a pass, with its token) goes straight
into ``cli.main``: no module attribute of hookcli's holds it.
"""

import sys


def main() -> None:
    from hookcli.streams import adopt_closed_stdout

    adopt_closed_stdout()  # stdout closed (>&-): fd 1 taken before anything opens a file
    if sys.argv[1:2] == ["watch"]:  # COMMAND starts without building the Typer app first
        from hookcli.watch.fastpath import main as watch_main

        watch_main(sys.argv[2:])  # returns only when the full CLI should run it
    from hookcli import exitguard

    herald = exitguard.guard() if exitguard.should_guard(sys.argv[1:]) else None  # forks
    from hookcli.cli import main as cli_main

    cli_main(herald)
