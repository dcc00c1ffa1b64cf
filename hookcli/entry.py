"""The console script and ``python -m hookcli``: the watching parent first (where it
applies, hookcli/watch.py), then the CLI in the child."""

import sys


def main() -> None:
    from hookcli import watch

    if watch.should_watch(sys.argv[1:]):
        watch.watch()  # returns in the child
    from hookcli.cli import main as cli_main

    cli_main()
