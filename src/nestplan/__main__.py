"""``python -m nestplan``: the same command line as ``nestplan``."""

from nestplan.cli import main

if __name__ == "__main__":
    main()
