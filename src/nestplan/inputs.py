"""One reader for every input file and string: bounded, decoded, parsed and checked once.

Every file nestplan reads (a Hugging Face ``config.json``, a cluster TOML/JSON file, a sweep
spec, a plan JSON, a NEST solver input, a runs file) goes through :func:`load_file` or
:func:`parse_text`, which turn every size, encoding, syntax, nesting, finiteness and
control-character problem into one :class:`ConfigError` naming the file. The typed readers
above it then check fields and ranges, naming the field and the allowed values.

Strings that may reach a generated script or a terminal are checked here too: no control
character (a newline would end a comment line in a launch script; an escape sequence would
rewrite the terminal) survives a reader.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from nestplan.errors import ConfigError, printable

MAX_FILE_BYTES = 16 * 2**20  # the largest input file read: 16 MiB (configs and plans are a few kB)
MAX_DEPTH = 64  # nesting of JSON/TOML tables and arrays (configs and plans nest 4 deep)
MAX_STRING_CHARS = 4096  # one string value
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-/@:=, ]{0,199}$")  # names that label plans and files


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (C0, DEL, C1, line or paragraph separator)."""
    return bool(_CONTROL.search(text))


def check_string(value: str, field: str, origin: str) -> str:
    """``value`` itself, refused when it holds a control character or is longer than the bound."""
    if len(value) > MAX_STRING_CHARS:
        raise ConfigError(
            f"{origin}: {field} is {len(value)} characters long; at most {MAX_STRING_CHARS} allowed",
            field=field,
            value=len(value),
            limit=MAX_STRING_CHARS,
            unit="characters",
        )
    if has_control(value):
        raise ConfigError(
            f"{origin}: {field} '{printable(value)}' holds a control character (newline, tab, escape ...)",
            field=field,
            value=printable(value),
            limit="printable characters",
        )
    return value


def check_name(value: Any, field: str, origin: str) -> str:
    """A name that labels a plan, a file header or a table row: letters, digits and ``._+-/@:=, ``."""
    if not isinstance(value, str) or not SAFE_NAME.match(value):
        shown = printable(value) if isinstance(value, str) else value
        raise ConfigError(
            f"{origin}: {field} '{shown}' must be 1-200 characters of letters, digits and . _ + - / @ : = , "
            "(space), starting with a letter or digit",
            field=field,
            value=shown,
            limit=SAFE_NAME.pattern,
        )
    return value


def _check_tree(value: Any, origin: str) -> None:
    """Depth, finite numbers and clean strings over a parsed document, without recursion."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"{origin}: nested deeper than {MAX_DEPTH} levels at {where or 'the top'}",
                field=where or "document",
                value=depth,
                limit=MAX_DEPTH,
                unit="levels",
            )
        if isinstance(node, dict):
            for key, item in node.items():
                path = f"{where}.{key}" if where else str(key)
                check_string(str(key), f"key '{printable(str(key))}'", origin)
                stack.append((item, depth + 1, path))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, f"{where}[{i}]") for i, item in enumerate(node))
        elif isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(
                f"{origin}: {where or 'value'} is {node}; numbers must be finite",
                field=where,
                value=str(node),
                limit="a finite number",
            )
        elif isinstance(node, str):
            check_string(node, where or "value", origin)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number nestplan accepts (numbers must be finite)")


def parse_text(text: str, kind: str, origin: str) -> Any:
    """Parse ``text`` as ``kind`` ('json' or 'toml') and check the whole document; ConfigError otherwise."""
    assert kind in ("json", "toml"), kind
    try:
        if kind == "json":
            data = json.loads(text, parse_constant=_refuse_constant)
        else:
            data = tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{origin}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", field="file", value=origin
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: invalid TOML: {printable(str(exc))}", field="file", value=origin) from None
    except RecursionError:
        raise ConfigError(
            f"{origin}: nested deeper than {MAX_DEPTH} levels", field="file", value=origin, limit=MAX_DEPTH
        ) from None
    except ValueError as exc:  # NaN/Infinity constants, integers beyond Python's digit limit
        raise ConfigError(f"{origin}: {printable(str(exc))}", field="file", value=origin) from None
    _check_tree(data, origin)
    return data


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file of at most ``MAX_FILE_BYTES``; ``what`` names it in errors ('cluster file')."""
    p = Path(path)
    origin = f"{what} '{printable(str(p))}'"
    try:
        if not p.is_file():
            raise ConfigError(f"{origin} does not exist or is not a file", field="path", value=printable(str(p)))
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"{origin} is {size / 2**20:.1f} MiB; at most {MAX_FILE_BYTES // 2**20} MiB is read",
                field="path",
                value=size,
                limit=MAX_FILE_BYTES,
                unit="bytes",
            )
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"{origin} cannot be read: {exc.strerror or exc}", field="path", value=printable(str(p))
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{origin}: not UTF-8 text (byte {exc.start})", field="path", value=printable(str(p))
        ) from None


def load_file(path: str | Path, what: str, kind: str | None = None) -> Any:
    """Read, parse and check one JSON or TOML file (``kind`` from the suffix when omitted)."""
    p = Path(path)
    kind = kind or ("toml" if p.suffix.lower() == ".toml" else "json")
    return parse_text(read_text(p, what), kind, f"{what} '{printable(str(p))}'")


def load_object(path: str | Path, what: str, kind: str | None = None) -> dict[str, Any]:
    """:func:`load_file` for a document whose top level must be an object (a table)."""
    data = load_file(path, what, kind)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} '{printable(str(path))}': the top level must be an object, got {type(data).__name__}",
            field="file",
            value=printable(str(path)),
            limit="object",
        )
    return data
