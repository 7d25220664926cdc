"""Measured runs against nestplan's predictions (`nestplan validate RUNS.json`).

A runs file (docs/formats.md, "Runs file") lists training runs as they ran: the model (inline as a
Hugging Face config.json, by catalog name or by file), the cluster, the parallel configuration, the
framework settings and what was measured (the step time, and the memory per device where known).
Each row is evaluated as it ran and compared with its measurement; a row that cannot be read or
evaluated is reported in one line and the others still are. This is how a user learns how far to
trust nestplan on their own cluster.

- ``rows``: the runs file's reader (its keys, its rows' columns, files relative to the runs file,
  the bounds on the work);
- ``published``: the measurement of a row (its metrics, their bounds and consistency, its memory);
- ``results``: the predictions against the measurements, their statistics and the tolerance verdict.
"""

from nestplan.validate.published import MEMORY_METRICS, METRICS, PUBLISHED_KEYS, Measured
from nestplan.validate.results import (
    Miss,
    RowResult,
    Summary,
    check_tolerance,
    evaluate_row,
    misses,
    summarise,
    validate,
)
from nestplan.validate.rows import (
    MAX_CHUNKS,
    MAX_RUNS,
    ROW_COLUMNS,
    SETTING_ALIASES,
    Run,
    Sources,
    read_runs,
    run_from_row,
)

__all__ = [
    "MAX_CHUNKS",
    "MAX_RUNS",
    "MEMORY_METRICS",
    "METRICS",
    "PUBLISHED_KEYS",
    "ROW_COLUMNS",
    "SETTING_ALIASES",
    "Measured",
    "Miss",
    "RowResult",
    "Run",
    "Sources",
    "Summary",
    "check_tolerance",
    "evaluate_row",
    "misses",
    "read_runs",
    "run_from_row",
    "summarise",
    "validate",
]
