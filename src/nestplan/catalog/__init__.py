"""Data files shipped with nestplan: accelerators, interconnects, clusters, models.

This module only locates files; parsing lives with the type each file describes
(``hardware``, ``network``, ``model``). Nothing is read at import time.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from nestplan.errors import UnknownNameError

_CATALOG_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9_-]+)*")  # no separators, no "..", no leading dot
_KINDS = {
    "model": ("models", ".json"),
    "cluster": ("clusters", ".toml"),
}


def user_path(text: str) -> Path:
    """``text`` as a path with ``~`` expanded where it can be (``~name`` of an unknown user stays as typed)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def is_file(path: Path) -> bool:
    """True when ``path`` is an existing file; False also when it cannot be examined (a name too
    long for the file system, a NUL byte, a folder without permission), so that probing a name
    the user typed never raises."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """True when ``path`` is an existing folder; False when it cannot be examined (see :func:`is_file`)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _root() -> Path:
    return Path(str(resources.files("nestplan.catalog")))


def data_file(filename: str) -> Path:
    """Path of a top-level catalog table such as ``accelerators.toml``."""
    path = _root() / filename
    assert path.is_file(), f"catalog file {filename} missing from the package"
    return path


def profile_file(accelerator: str, framework: str) -> Path | None:
    """The catalog's calibration profile for (``accelerator``, ``framework``), None where it has none (or where a
    name is not a catalog-style name: a name from a user's file never becomes a path)."""
    if not all(_CATALOG_NAME.fullmatch(name) for name in (accelerator, framework)):
        return None
    path = _root() / "profiles" / f"{accelerator}.{framework}.toml"
    return path if path.is_file() else None


def names(kind: str) -> list[str]:
    """Sorted catalog names of one kind ('model' or 'cluster')."""
    folder, suffix = _KINDS[kind]
    return sorted(p.name[: -len(suffix)] for p in (_root() / folder).iterdir() if p.name.endswith(suffix))


def entry_path(kind: str, name: str) -> Path:
    """Path of a catalog entry; raises UnknownNameError listing the valid names."""
    folder, suffix = _KINDS[kind]
    key = name.strip().lower()
    path = _root() / folder / f"{key}{suffix}"
    if not is_file(path):
        raise UnknownNameError(kind, name, names(kind))
    return path
