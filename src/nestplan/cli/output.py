"""What the commands print and write: rich consoles, stderr lines, JSON, and output paths checked
before any work and written whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from rich.console import Console

from nestplan import api, outputs
from nestplan.errors import ConfigError, printable

PIPE_WIDTH = 10_000  # columns of rich output that is not on a terminal: rows stay one line


# -- output: rich consoles, stderr lines, JSON --------------------------------------------------
def make_console(stderr: bool = False) -> Console:
    """A rich Console as wide as the terminal, or on a pipe so wide that nothing wraps."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def say(text: str) -> None:
    """One line on stderr, control characters escaped."""
    sys.stderr.write(printable(text) + "\n")


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")


def print_paths(console: Console, label: str, paths: list[Path]) -> None:
    if paths:
        console.print(f"{label}: " + ", ".join(printable(str(p)) for p in paths), markup=False)


# -- output paths ---------------------------------------------------------------------------------
def os_reason(exc: OSError, path: Path | None = None) -> str:
    """The system's reason, naming the file when it is not ``path`` itself."""
    named = exc.filename is not None and (path is None or str(exc.filename) != str(path))
    return (exc.strerror or printable(str(exc))) + (f" ('{printable(str(exc.filename))}')" if named else "")


@contextmanager
def output(option: str, path: Path) -> Iterator[None]:
    """An OSError while writing ``path`` (given by ``option``) as one ConfigError naming both."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(
            f"{option} '{printable(str(path))}' cannot be written: {os_reason(exc, path)}",
            field=option,
            value=printable(str(path)),
        ) from None


@contextmanager
def drawing(option: str, path: Path) -> Iterator[None]:
    """:func:`output` for figures, a missing matplotlib included."""
    with output(option, path):
        try:
            yield
        except ImportError as exc:
            raise ConfigError(
                f"{option} '{printable(str(path))}' needs matplotlib (pip install matplotlib): {printable(str(exc))}",
                field=option,
                value=printable(str(path)),
            ) from None


def check_output(option: str, path: Path, folder: bool) -> None:
    """Refuse, before any work, an output that cannot be written: a file where a folder is wanted
    or the reverse, a name too long, a parent that is a file or not writable."""
    shown = printable(str(path))
    with output(option, path):
        probe = path
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if probe == path and folder and not path.is_dir():
            raise ConfigError(f"{option} '{shown}' is not a folder", field=option, value=shown)
        if probe == path and not folder and path.is_dir():
            raise ConfigError(f"{option} '{shown}' is a folder; a file name is needed", field=option, value=shown)
        if probe != path and not probe.is_dir():
            raise ConfigError(
                f"{option} '{shown}': '{printable(str(probe))}' is not a folder", field=option, value=shown
            )
        if not os.access(probe, os.W_OK):
            raise ConfigError(
                f"{option} '{shown}': '{printable(str(probe))}' is not writable", field=option, value=shown
            )


def replacing(path: Path, option: str) -> AbstractContextManager[Path]:
    """A private temporary file to write, moved over ``path`` once complete (nestplan.outputs: a link at
    ``path`` refused, a special file such as /dev/stdout written through)."""
    return outputs.replaced(path, option)


def plots(out: Path, draw: Callable[[Path], list[Path]]) -> list[Path]:
    """The plan's figures written into ``out`` (``--plot``); a failure is one ConfigError."""
    with drawing("--plot", out):
        return draw(out)


def write_report(path: Path, page: Callable[[], str], quiet: bool = False) -> list[Path]:
    """The HTML report ``page`` builds, written whole to ``path`` (``--report``; missing folders created);
    one line on stderr names it (unless ``quiet``: the caller names it once every output is written)."""
    text = page()
    with output("--report", path):
        path.parent.mkdir(parents=True, exist_ok=True)
        outputs.write_text(path, text, "--report")
    if not quiet:
        say(f"nestplan: wrote the report {path}")
    return [path]


class LateOutputs:
    """A command's outputs written one after another (plots, then an export, then a report) before it
    prints anything, undone together: should a later one fail, the files the earlier ones wrote and the
    folders they created are removed, so that the command's one error line leaves nothing behind."""

    def __init__(self) -> None:
        self._files: list[Path] = []
        self._folders: list[Path] = []

    def write(self, folder: Path, write: Callable[[], list[Path]]) -> list[Path]:
        """``write()``'s paths (files it wrote into ``folder``, or the file ``folder`` itself), kept for undoing."""
        created = not folder.exists()
        try:
            paths = write()
        except BaseException:
            self.undo()
            raise
        self._files += paths
        if created:
            self._folders.append(folder)
        return paths

    def undo(self) -> None:
        for path in self._files:
            with suppress(OSError):
                path.unlink()
        for folder in reversed(self._folders):
            shutil.rmtree(folder, ignore_errors=True)


class progress:
    """A transient rich progress bar on stderr (only on a terminal): yields an advance callback,
    ``advance(i)`` after the i-th unit (from 0), or ``advance(i, total)`` where the total is known (a
    sweep's cases): the bar then shows done / total and the time left."""

    def __init__(self, unit: str = "groups", every: int = 64, verb: str = "planning") -> None:
        self._unit, self._every, self._verb = unit, every, verb

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn(self._verb),
            BarColumn(),
            TextColumn("{task.completed}" + "{task.fields[of]} " + self._unit),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not sys.stderr.isatty(),
        )
        self._bar.__enter__()
        task = self._bar.add_task("plan", total=None, of="")

        def advance(i: int, total: int | None = None) -> None:
            if i % self._every == 0 or total is not None:
                of = {} if total is None else {"total": total, "of": f" of {total}"}
                self._bar.update(task, completed=i + 1, **of)

        return advance

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


def print_trace(model: str, seq_len: int | None, console: Console) -> list:
    from rich.table import Table

    result, rows = api.trace(model, seq_len)
    table = Table(title=f"{result.model_type}: {result.tokens} tokens, traced in {result.seconds:.1f} s")
    for col in ("block", "traced GFLOP", "closed form GFLOP", "traced MiB saved", "closed form MiB saved"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['block']}{' (MoE)' if r['moe'] else ''}",
            f"{r['traced_flops'] / 1e9:,.1f}",
            f"{r['closed_flops'] / 1e9:,.1f}",
            f"{r['traced_saved_bytes'] / 2**20:,.1f}",
            f"{r['closed_saved_bytes'] / 2**20:,.1f}",
        )
    console.print(table)
    return rows
