"""``python -m hookcli``."""

from hookcli.entry import main

main()
