"""``python -m hookcli``."""

from hookcli.cli import main

main()
