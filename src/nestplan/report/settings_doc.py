"""The run settings as docs/formats.md lists them: the field table (nestplan.settings) with what every
exporter does with each setting (its ``SETTINGS`` declarations). tests/unit/test_settings_doc.py
checks that the documentation holds this text; ``python3 -m nestplan.report.settings_doc`` prints it."""

from __future__ import annotations

from enum import Enum

from nestplan.export import EXPORTERS
from nestplan.settings import Setting, setting_table


def _default(entry: Setting) -> str:
    value = entry.default
    if value is None:
        return "none"
    return str(value.value if isinstance(value, Enum) else value).lower()


def _values(entry: Setting) -> str:
    if entry.kind is bool:
        return f"`{entry.flag}` / `--no-{entry.flag[2:]}`"
    if entry.bounds is not None:
        low, high = entry.bounds
        return f"`{entry.flag}` {low:g} to {high:g}"
    return f"`{entry.flag}` " + " \\| ".join(entry.choices)


def settings_markdown() -> str:
    """Two tables: each setting's option, default and meaning; then what each exporter does with it."""
    lines = ["| setting | option | default | what it is | framework's own name |", "|---|---|---|---|---|"]
    for entry in setting_table():
        searched = " (plan: searched)" if entry.searched else ""
        row = (f"`{entry.name}`", _values(entry), _default(entry) + searched, entry.help, entry.source)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| setting | " + " | ".join(EXPORTERS) + " |", "|---" * (1 + len(EXPORTERS)) + "|"]
    for entry in setting_table():
        cells = [f"{s.handling.value}: {s.how}" for s in (EXPORTERS[f].SETTINGS[entry.name] for f in EXPORTERS)]
        lines.append(f"| `{entry.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
