"""Helpers shared by the CLI tests."""

from __future__ import annotations

import pytest

from nestplan.cli import main


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``nestplan argv``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code or 0, out.out, out.err


def with_options(base: list[str], overrides: list[str]) -> list[str]:
    """``base`` with each ``--flag value`` pair of ``overrides`` replaced or appended."""
    args = list(base)
    for i in range(0, len(overrides), 2):
        if overrides[i] in args:
            args[args.index(overrides[i]) + 1] = overrides[i + 1]
        else:
            args += overrides[i : i + 2]
    return args
