"""The one writer of every file nestplan writes (reports, plots, CSV, plans, exports, profiles, solver
outputs): whole or not at all, never through a link someone else left at the target.

- one file (:func:`replaced`, :func:`write_text`): written into a private folder created beside the
  target (``tempfile.mkdtemp``: created exclusively, an unpredictable name, mode 0700, so nobody else
  can put a link in it), fsync'd, given its final mode, then ``os.replace``'d onto the target;
- several files (:func:`staged`): written into a private temporary folder beside the target folder
  (``tempfile.mkdtemp``, mode 0700), then moved in as a whole (the folder renamed into place when it is
  new, each file renamed into it otherwise), so a failure leaves none of them;
- a target that is a symbolic link is refused in one line (the file it points to is untouched), unless
  it leads to a special file such as /dev/stdout, which is written through; so is a target folder that
  is a link;
- modes are set on the temporary file before the rename: no existing file or folder is chmod'ed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nestplan.errors import ConfigError, printable

PRIVATE_PREFIX = ".nestplan-"  # temporary files and folders beside a target start with this


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode(executable: bool = False) -> int:
    """The mode a new file gets (0666, 0777 for a script, less the umask), as open() would give it."""
    return (0o777 if executable else 0o666) & ~_umask()


def _special(path: Path) -> bool:
    """Does ``path`` lead to something other than a regular file or a folder (a terminal, a pipe, /dev/null)?"""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def refuse_link(path: Path, option: str) -> None:
    """Refuse a target that is a symbolic link (to anything but a special file), in one line."""
    if path.is_symlink() and not _special(path):
        shown = printable(str(path))
        raise ConfigError(
            f"{option} '{shown}' is a symbolic link; nestplan does not write through links: remove it or "
            "choose another name",
            field=option,
            value=shown,
        )


@contextmanager
def replaced(path: Path, option: str, executable: bool = False) -> Iterator[Path]:
    """A path to write ``path``'s content to by name, in a private folder beside it; on leaving, the
    file is fsync'd, given its mode and moved over ``path`` whole; on an exception, nothing is left.
    A special file (/dev/stdout) is written through."""
    path = Path(path)
    if _special(path):
        yield path
        return
    refuse_link(path, option)
    stage = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, suffix=".partial", dir=path.parent))
    try:
        temporary = stage / path.name
        yield temporary
        _settle(temporary, executable)
        refuse_link(path, option)
        os.replace(temporary, path)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _settle(path: Path, executable: bool) -> None:
    """Flush ``path`` to the disk and give it a new file's mode (the temporary, before its rename)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
        os.fchmod(fd, file_mode(executable))
    finally:
        os.close(fd)


def write_text(path: Path, text: str, option: str, executable: bool = False) -> None:
    """``text`` written to ``path`` whole, in UTF-8 (:func:`replaced`)."""
    with replaced(path, option, executable) as temporary:
        temporary.write_text(text, encoding="utf-8")


@contextmanager
def staged(folder: Path, option: str) -> Iterator[Path]:
    """A private folder to write several files into, by name; on leaving, they are moved into ``folder``
    (created when missing) as a whole; on an exception, none of them is left. Files of ``folder`` that
    are links where a staged file would go are refused before anything moves."""
    folder = Path(folder)
    refuse_link(folder, option)
    if folder.exists() and not folder.is_dir():
        shown = printable(str(folder))
        raise ConfigError(f"{option} '{shown}' exists and is not a folder", field=option, value=shown)
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, suffix=".partial", dir=folder.parent))
    try:
        yield stage
        names = sorted(p.name for p in stage.iterdir())
        for name in names:
            _settle(stage / name, os.access(stage / name, os.X_OK))
        if not folder.exists():
            os.chmod(stage, 0o777 & ~_umask())
            os.rename(stage, folder)
            return
        for name in names:
            refuse_link(folder / name, option)
        for name in names:
            os.replace(stage / name, folder / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
