"""``python -m hookcli``."""

from hookcli.watch import main

main()
