"""``python -m nestplan.cli``: the command line."""

from nestplan.cli import main

main()
