"""One reader for every input file and string: bounded, decoded, parsed and checked once.

Every file nestplan reads (a Hugging Face ``config.json``, a cluster TOML/JSON file, a sweep
spec, a plan JSON, a NEST solver input, a runs file) goes through :func:`load_file` or
:func:`parse_text`, which turn every size, encoding, syntax, nesting, finiteness and
control-character problem into one :class:`ConfigError` naming the file. The typed readers
above it then check fields and ranges, naming the field and the allowed values: :class:`Fields`
reads one mapping's fields that way.

Strings that may reach a generated script or a terminal are checked here too: no control
character (a newline would end a comment line in a launch script; an escape sequence would
rewrite the terminal) survives a reader.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from nestplan.errors import ConfigError, brief, did_you_mean, printable

MAX_FILE_BYTES = 16 * 2**20  # the largest input file read: 16 MiB (configs and plans are a few kB)
MAX_DEPTH = 64  # nesting of JSON/TOML tables and arrays (configs and plans nest 4 deep)
MAX_STRING_CHARS = 4096  # one string value
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-/@:=, ]{0,199}$")  # names that label plans and files


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (C0, DEL, C1, line or paragraph separator)."""
    return bool(_CONTROL.search(text))


def check_length(value: str, field: str, origin: str, limit: int) -> None:
    """Refuse ``value`` (``field`` of ``origin``) when it is longer than ``limit`` characters."""
    if len(value) > limit:
        raise ConfigError(
            f"{origin}: {field} is {len(value)} characters long; at most {limit} allowed",
            field=field,
            value=len(value),
            limit=limit,
            unit="characters",
        )


def check_string(value: str, field: str, origin: str) -> str:
    """``value`` itself, refused when it holds a control character or is longer than the bound."""
    check_length(value, field, origin, MAX_STRING_CHARS)
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


MISSING: Any = object()  # a getter's default when the field is required


class Fields:
    """Typed, bounded access to the fields of one mapping (a config.json, a table of a file). Each
    getter checks one field's type and range and records it as read; an absent or null field takes
    the getter's default and is an error where it has none. Every error is one ConfigError whose
    line starts with ``origin`` and which names the field (prefixed by ``where`` inside a nested
    object, as ``levels[1].``), its value and the allowed values."""

    def __init__(self, data: Mapping[str, Any], origin: str, where: str = "") -> None:
        self.data = data
        self.origin = origin
        self.where = where
        self.read: set[str] = set()

    def error(
        self, message: str, key: str | None = None, value: Any = None, limit: Any = None, unit: str | None = None
    ) -> ConfigError:
        return ConfigError(f"{self.origin}: {message}", field=key, value=value, limit=limit, unit=unit)

    def name(self, key: str) -> str:
        """``key`` as errors name it: with the nested object's prefix."""
        return f"{self.where}{key}"

    def has(self, key: str) -> bool:
        self.read.add(key)
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = MISSING) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            if default is MISSING:
                raise self.error(f"missing field '{self.name(key)}'", self.name(key))
            return default
        return value

    def _refuse(self, key: str, wanted: str, value: Any, limit: Any) -> ConfigError:
        return self.error(
            f"field '{self.name(key)}' must be {wanted}, got {brief(value)}", self.name(key), brief(value), limit
        )

    def integer(self, key: str, maximum: int, default: Any = MISSING, minimum: int = 1) -> int:
        """An integer (not a bool, not ``2.0``; a NumPy integer too) in ``minimum..maximum``."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not minimum <= value <= maximum:
            raise self._refuse(key, f"an integer in {minimum}..{maximum}", value, f"{minimum}..{maximum}")
        return int(value)

    def number(self, key: str, minimum: float, maximum: float, default: Any = MISSING) -> float:
        """A number (not a bool) in the closed range ``[minimum, maximum]`` (NaN fails it)."""
        value = self.raw(key, default)
        allowed = f"[{minimum:g}, {maximum:g}]"
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not minimum <= value <= maximum:
            raise self._refuse(key, f"a number in {allowed}", value, allowed)
        return float(value)

    def probability(self, key: str, default: Any = MISSING) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise self._refuse(key, "a probability in [0, 1]", value, "[0, 1]")
        return float(value)

    def fraction(self, key: str, default: Any = MISSING) -> float:
        """A number in (0, 1] (not a bool)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise self._refuse(key, "a number in (0, 1]", value, "(0, 1]")
        return float(value)

    def flag(self, key: str, default: Any = MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self._refuse(key, "true or false", value, "true, false")
        return value

    def string(self, key: str, default: Any = MISSING, maximum: int = MAX_STRING_CHARS, blank: bool = False) -> str:
        """A string without control characters, at most ``maximum`` characters long, non-empty unless ``blank``."""
        value = self.raw(key, default)
        if not isinstance(value, str) or not (blank or value.strip()):
            wanted = "a string" if blank else "a non-empty string"
            raise self._refuse(key, wanted, value, wanted)
        if len(value) > maximum:
            raise self.error(
                f"field '{self.name(key)}' is {len(value)} characters long; at most {maximum} allowed",
                self.name(key),
                len(value),
                maximum,
            )
        return check_string(value, self.name(key), self.origin)

    def choice(self, key: str, allowed: Sequence[str], default: Any = MISSING) -> str:
        """One of the strings ``allowed``; a string that is not names the closest of them ("did you mean")."""
        value = self.raw(key, default)
        if not isinstance(value, str) or value not in allowed:
            mean = did_you_mean(value, allowed) if isinstance(value, str) else ""
            raise self.error(
                f"field '{self.name(key)}' is {brief(value)}; allowed: {', '.join(allowed)}{mean}",
                self.name(key),
                brief(value),
                list(allowed),
            )
        return value

    def items(self, key: str, maximum: int, default: Any = MISSING, minimum: int = 0) -> list[Any]:
        """A list of ``minimum`` to ``maximum`` entries (each checked by the caller)."""
        value = self.raw(key, default)
        if not isinstance(value, list) or not minimum <= len(value) <= maximum:
            wanted = f"a list of {maximum}" if minimum == maximum else f"a list of {minimum} to {maximum}"
            wanted = f"a list of at most {maximum}" if minimum == 0 else wanted
            if not isinstance(value, list):
                raise self._refuse(key, f"{wanted} entries", value, f"{minimum}..{maximum} entries")
            raise self.error(
                f"field '{self.name(key)}' must be {wanted} entries, got {len(value)}",
                self.name(key),
                len(value),
                f"{minimum}..{maximum} entries",
            )
        return value

    def table(self, key: str, default: Any = MISSING) -> Fields:
        """The nested object ``key``, read with the same origin, its fields named ``key.field``."""
        value = self.raw(key, default)
        if not isinstance(value, Mapping):
            raise self._refuse(key, "an object", value, "an object")
        return Fields(value, self.origin, f"{self.name(key)}.")

    def listed(self, key: str, maximum: int, default: Any = MISSING, minimum: int = 0) -> Fields:
        """The list ``key`` (``minimum`` to ``maximum`` entries) as fields ``[0]``, ``[1]`` ..., so that its
        entries are read by the getters and named ``key[i]`` (``dims[1]``, ``levels[0].size``)."""
        value = self.items(key, maximum, default, minimum)
        return Fields({f"[{i}]": item for i, item in enumerate(value)}, self.origin, self.name(key))

    def many(
        self, key: str, maximum: int, default: Any = MISSING, expand: Callable[[Fields], list[Any]] | None = None
    ) -> Fields:
        """One value or a list of 1 to ``maximum`` of them (a sweep's), as :meth:`listed` gives a list; with
        ``expand``, an object in their place (a range) is read by it into the list."""
        value = self.raw(key, default)
        if expand is not None and isinstance(value, Mapping):
            value = expand(self.table(key))
        values = value if isinstance(value, list) else [value]
        return Fields({key: values}, self.origin, self.where).listed(key, maximum, minimum=1)

    def tables(self, key: str, maximum: int, minimum: int = 1) -> list[Fields]:
        """The list of objects ``key`` (``minimum`` to ``maximum`` of them), each read with the same origin,
        its fields named ``key[i].field``."""
        listed = self.listed(key, maximum, minimum=minimum)
        return [listed.table(index) for index in listed.data]

    def require(self, keys: Sequence[str]) -> None:
        """Refuse, by name, the first of ``keys`` that is absent or null (before any value is checked)."""
        for key in keys:
            if self.data.get(key) is None:
                raise self.error(
                    f"missing field '{self.name(key)}'; required: {', '.join(keys)}", self.name(key), None, list(keys)
                )

    def refuse_unknown(self, allowed: Sequence[str]) -> None:
        """Refuse, by name, the first key that is not in ``allowed``."""
        for key in self.data:
            if key not in allowed:
                raise self.error(
                    f"unknown field '{printable(self.name(str(key)))}'; allowed: {', '.join(allowed)}",
                    self.name(str(key)),
                    brief(self.data[key]),
                    list(allowed),
                )
