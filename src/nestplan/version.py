"""The installed package's version, for ``nestplan --version``, the exports and the sweep's result keys."""

from importlib import metadata

try:
    __version__ = metadata.version("nestplan")
except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"
