"""Command-line values: integers in plain decimal digits within bounds, lists, layouts, rank orders."""

from __future__ import annotations

import re
from collections.abc import Callable

from nestplan.errors import ConfigError, brief, printable
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN
from nestplan.network.topology import MAX_DEVICES  # --devices, and each parallel degree
from nestplan.strategy.enums import Schedule

MAX_MICRO_BATCH = MAX_GLOBAL_BATCH_SIZE
MAX_VIRTUAL_STAGES = 1024  # model chunks per pipeline stage
MAX_STAGES = 1024  # entries of --layers-per-stage (pp, or pp x v), NxK repeats counted
MAX_LIST_ENTRIES = 64  # entries of compare's --devices and --mbs

# -- integers: plain decimal digits within bounds --------------------------------------------------
_DIGITS = re.compile(r"-?[0-9]+")


def shown(text: str, limit: int = 40) -> str:
    text = printable(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_int(option: str, text: str, low: int, high: int) -> int:
    """``text`` as an integer in low..high: digits 0-9 only (a minus sign reads as out of range);
    no '+', '_', exponent, decimal point or space."""
    if not _DIGITS.fullmatch(text):
        raise ConfigError(
            f"{option} '{shown(text)}' is not a plain decimal integer (digits 0-9 only); allowed: {low}..{high}",
            field=option,
            value=shown(text),
            limit=f"{low}..{high}",
        )
    if len(text.lstrip("-0")) > len(str(high)) or not low <= int(text) <= high:
        raise ConfigError(
            f"{option} {shown(text)} is out of range; allowed: {low}..{high}",
            field=option,
            value=shown(text),
            limit=f"{low}..{high}",
        )
    return int(text)


def schedule_list(text: str | None) -> tuple[Schedule, ...] | None:
    """``--schedules``: comma-separated schedule names."""
    if text is None:
        return None
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    known = [s.value for s in Schedule]
    for name in names:
        if name not in known:
            raise ConfigError(
                f"--schedules names '{printable(name)}'; choose from: {', '.join(known)}",
                field="schedules",
                value=printable(name),
                limit=known,
            )
    if not names:
        raise ConfigError(
            "--schedules is empty; name at least one of: " + ", ".join(known),
            field="schedules",
            value=text,
            limit=known,
        )
    return tuple(Schedule(n) for n in names)


MAX_ETP_VALUES = 8  # --etp entries: the divisors of any tp nestplan searches (at most 64) are 7


def expert_tp_list(text: str | None) -> tuple[int | None, ...] | None:
    """``plan --etp``: comma-separated expert tensor-parallel degrees, 'tp' for etp = tp (no folding)."""
    if text is None:
        return None
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not parts or len(parts) > MAX_ETP_VALUES:
        raise ConfigError(
            f"--etp takes 1 to {MAX_ETP_VALUES} comma-separated values ('tp' or integers), got {printable(text)!r}",
            field="etp",
            value=printable(text),
            limit=MAX_ETP_VALUES,
        )
    out: list[int | None] = []
    for part in parts:
        if part == "tp":
            out.append(None)
        elif part.isdigit() and 1 <= int(part) <= MAX_DEVICES:
            out.append(int(part))
        else:
            raise ConfigError(
                f"--etp value '{printable(part)}' is neither 'tp' nor an integer in 1..{MAX_DEVICES}",
                field="etp",
                value=printable(part),
                limit=f"tp or 1..{MAX_DEVICES}",
            )
    return tuple(out)


ETP_HELP = (
    "expert tensor parallelism (MoE parallel folding): each expert split over etp consecutive ranks of a tp "
    "group, the tp / etp ranks of each tp group joining the ep ranks in expert parallelism (Megatron's "
    "--expert-model-parallel-size = ep x tp / etp)"
)


def fraction(option: str) -> Callable[[object], float]:
    """A typer parser for a fraction option (a number; its range is checked where it is used)."""

    def parse(value: object) -> float:
        if isinstance(value, float):
            return value
        try:
            number = float(str(value))
        except ValueError:
            raise ConfigError(
                f"{option} must be a number, got {brief(value)}", field=option.lstrip("-"), value=brief(value)
            ) from None
        if number != number:  # NaN
            raise ConfigError(f"{option} must be a number, got nan", field=option.lstrip("-"), value="nan")
        return number

    return parse


def integer(option: str, low: int, high: int) -> Callable[[object], int]:
    """A typer parser for the integer option ``option`` (its default passes as it is)."""

    def parse(value: object) -> int:
        return value if isinstance(value, int) else _parse_int(option, str(value), low, high)

    return parse


# context parallelism (job settings shared by evaluate and plan; Megatron-LM's names)
def int_list(text: str, option: str, high: int, entries: int) -> tuple[int, ...]:
    """Comma-separated integers in 1..high, at most ``entries`` of them."""
    items = [x.strip() for x in text.split(",")]
    if len(items) > entries:
        raise ConfigError(
            f"{option} has {len(items)} entries; at most {entries} allowed",
            field=option,
            value=len(items),
            limit=entries,
        )
    if not any(items):
        raise ConfigError(
            f"{option} '{shown(text)}' needs comma-separated integers, e.g. 64,128", field=option, value=shown(text)
        )
    return tuple(_parse_int(option, x, 1, high) for x in items)


DEVICES = integer("--devices", 1, MAX_DEVICES)
GLOBAL_BATCH = integer("--global-batch-size", 1, MAX_GLOBAL_BATCH_SIZE)
SEQ_LEN = integer("--seq-len", 1, MAX_SEQ_LEN)


_LAYER_ITEM = re.compile(r"([0-9]+)(?:x([0-9]+))?")  # a count, or NxK: the count N repeated K times


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """``--layers-per-stage``: comma-separated counts (0 allowed: the dims say where), each a plain
    decimal integer or NxK (N repeated K times: 1,2x62,1 is 1, 62 twos, 1), at most MAX_STAGES in all."""
    if not text:
        return None
    option, counts = "--layers-per-stage", []
    for item in (x.strip() for x in text.split(",")):
        match = _LAYER_ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"{option} '{shown(item)}' is not a plain decimal integer or NxK (N repeated K "
                "times, digits 0-9), e.g. 1,2x62,1",
                field=option,
                value=shown(item),
            )
        count = _parse_int(option, match[1], 0, MAX_DEVICES)
        repeat = _parse_int(option, match[2], 1, MAX_STAGES) if match[2] else 1
        if len(counts) + repeat > MAX_STAGES:
            raise ConfigError(
                f"{option} has more than {MAX_STAGES} entries; at most {MAX_STAGES} allowed",
                field=option,
                value=shown(text),
                limit=MAX_STAGES,
            )
        counts += [count] * repeat
    return tuple(counts)


def parse_axis_order(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.replace("-", ",").split(","))


def number(option: str, low: float, high: float) -> Callable[[object], float]:
    """A typer parser for a number in [low, high] (a finite decimal or exponent form: 15e12)."""

    def parse(value: object) -> float:
        if isinstance(value, float):
            return value
        try:
            result = float(str(value))
        except ValueError:
            result = float("nan")
        if not low <= result <= high:
            raise ConfigError(
                f"{option} {shown(str(value))} is not a number in [{low:g}, {high:g}]",
                field=option.lstrip("-"),
                value=shown(str(value)),
                limit=f"[{low:g}, {high:g}]",
            )
        return result

    return parse


def devices_range(text: str | None) -> tuple[int, int] | None:
    """``--devices-range LOW..HIGH``: two device counts, LOW at most HIGH."""
    if text is None:
        return None
    low, sep, high = text.partition("..")
    if not sep:
        raise ConfigError(
            f"--devices-range '{shown(text)}' must be LOW..HIGH, e.g. 256..16384",
            field="devices-range",
            value=shown(text),
            limit="LOW..HIGH",
        )
    bounds = (
        _parse_int("--devices-range", low.strip(), 1, MAX_DEVICES),
        _parse_int("--devices-range", high.strip(), 1, MAX_DEVICES),
    )
    if bounds[0] > bounds[1]:
        raise ConfigError(
            f"--devices-range {shown(text)}: LOW must not exceed HIGH", field="devices-range", value=shown(text)
        )
    return bounds
