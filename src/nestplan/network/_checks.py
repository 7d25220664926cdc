"""Small validators shared by the network builders (messages name the field, the value and what is allowed)."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from nestplan.errors import ConfigError, brief


def _as_int(value: Any, field: str, where: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer (not a bool) in ``minimum..maximum`` (no upper bound when ``maximum`` is None)."""
    allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise ConfigError(
            f"{where}: {field} must be an integer {allowed}, got {brief(value)}",
            field=field,
            value=brief(value),
            limit=allowed,
        )
    return int(number)


def _as_float(value: Any, field: str, where: str, *, positive: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and (not isinstance(value, int) or abs(value) <= 2**1023)  # float() of a larger int overflows
    number = float(value) if ok else math.nan
    if not ok or not math.isfinite(number) or number < 0 or (positive and number == 0):
        allowed = "> 0" if positive else ">= 0"
        raise ConfigError(
            f"{where}: {field} must be a finite number {allowed}, got {brief(value)}",
            field=field,
            value=brief(value),
            limit=allowed,
        )
    return number
