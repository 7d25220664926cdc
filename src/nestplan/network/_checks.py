"""Small validators shared by the network builders (messages name the field, the value and what is allowed)."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from nestplan.errors import ConfigError


def _as_int(value: Any, field: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {value!r}",
                          field=field, value=value, limit=f">= {minimum}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {value!r}",
                          field=field, value=value, limit=f">= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{where}: {field} must be an integer >= {minimum}, got {number}",
                          field=field, value=number, limit=f">= {minimum}")
    return int(number)


def _as_float(value: Any, field: str, where: str, *, positive: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    number = float(value) if ok else math.nan
    if not ok or not math.isfinite(number) or number < 0 or (positive and number == 0):
        allowed = "> 0" if positive else ">= 0"
        raise ConfigError(f"{where}: {field} must be a finite number {allowed}, got {value!r}",
                          field=field, value=value, limit=allowed)
    return number
