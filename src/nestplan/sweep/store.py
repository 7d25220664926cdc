"""The result store: one SQLite file, one row per case keyed by the hash of its inputs.

Only the sweep's driver writes, one transaction per finished case, so a driver or worker
killed at any moment leaves every finished case on disk and none twice (the key is the
primary key; a re-run inserts only what is missing). WAL journaling lets `sweep report`
read while a sweep runs.

Every failure of the file (a folder that is a file or not writable, a full disk, a file that
is not an SQLite database or holds another schema, a row that does not decode) is one
ConfigError naming the store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nestplan.errors import ConfigError, printable
from nestplan.inputs import parse_text

COLUMNS = (
    "key",
    "model",
    "cluster",
    "label",
    "accelerator",
    "overrides",
    "devices",
    "global_batch_size",
    "seq_len",
    "hbm_GiB",
    "status",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "step_time_s",
    "mfu",
    "peak_memory_GiB",
    "plan",
    "details",
    "error",
    "solve_time_s",
    "finished_at",
)
# what a case produces (solve time and finish time aside)
RESULT_FIELDS = COLUMNS[COLUMNS.index("status") : COLUMNS.index("error") + 1]
STATUSES = ("ok", "infeasible", "error")
PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "sp", "micro_batch_size", "zero_stage")  # what a report shows
MAX_ROWS = 1_000_000  # rows a store may hold for reading (a spec expands to at most 100,000 cases)

SCHEMA = """CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY, model TEXT, cluster TEXT, label TEXT, accelerator TEXT, overrides TEXT, devices INTEGER,
    global_batch_size INTEGER, seq_len INTEGER, hbm_GiB REAL, status TEXT, tokens_per_s REAL,
    tokens_per_s_per_device REAL, step_time_s REAL, mfu REAL, peak_memory_GiB REAL, plan TEXT, details TEXT, error TEXT,
    solve_time_s REAL, finished_at REAL)"""


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._where = f"sweep store '{printable(str(path))}'"
        self._make_folder()
        with self._guard():
            self._db = sqlite3.connect(path, timeout=30)
        try:
            with self._guard():
                self._check_schema()
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
        except ConfigError:
            self._db.close()
            raise

    def _make_folder(self) -> None:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{self._where}: its folder '{printable(str(folder))}' cannot be made: {exc.strerror or exc}",
                field="out",
                value=printable(str(folder)),
                limit="a writable folder",
            ) from None

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a failure of the file (OSError, sqlite3.DatabaseError) into one ConfigError naming it."""
        try:
            yield
        except (OSError, sqlite3.DatabaseError) as exc:
            raise ConfigError(
                f"{self._where}: {printable(str(exc))}",
                field="out",
                value=printable(str(self.path)),
                limit="a writable SQLite file written by nestplan sweep",
            ) from None

    def _check_schema(self) -> None:
        """Create the table in an empty database; refuse any other database (nothing is changed in it)."""
        tables = [name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if not tables:
            self._db.execute(SCHEMA)
            self._db.commit()
            return
        columns = tuple(row[1] for row in self._db.execute("PRAGMA table_info(results)"))
        if columns != COLUMNS:
            raise ConfigError(
                f"{self._where} holds another schema (tables {printable(', '.join(tables))[:200]}); "
                "use another --out folder",
                field="out",
                value=printable(str(self.path)),
                limit="a results table written by nestplan sweep",
            )

    def check_writable(self) -> None:
        """Fail now, before any case is solved, when the file cannot be written (read-only, locked)."""
        with self._guard():
            self._db.execute("DELETE FROM results WHERE 0")  # a write that changes nothing
            self._db.rollback()

    def keys(self) -> set[str]:
        with self._guard():
            return {row[0] for row in self._db.execute("SELECT key FROM results")}

    def put(self, inputs: dict[str, Any], result: dict[str, Any]) -> bool:
        """Record one finished case (committed at once); False when it was already there."""
        row = {
            "key": inputs["key"],
            "model": inputs["model"],
            "cluster": inputs["cluster"],
            "label": inputs["label"],
            "accelerator": inputs["accelerator"],
            "overrides": json.dumps(inputs["overrides"], sort_keys=True),
            "devices": inputs["devices"],
            "global_batch_size": inputs["global_batch_size"],
            "seq_len": inputs["seq_len"],
            "hbm_GiB": inputs["hbm_GiB"],
            "solve_time_s": result.get("solve_time_s"),
            "finished_at": time.time(),
        }
        for f in RESULT_FIELDS:
            value = result.get(f)
            row[f] = json.dumps(value, sort_keys=True) if f in ("plan", "details") and value is not None else value
        with self._guard():
            cur = self._db.execute(
                f"INSERT OR IGNORE INTO results ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})",
                [row[c] for c in COLUMNS],
            )
            self._db.commit()
        return cur.rowcount == 1

    def rows(self) -> list[dict[str, Any]]:
        """Every row, decoded and checked (a row a report cannot show is a ConfigError naming its key)."""
        with self._guard():
            (count,) = self._db.execute("SELECT COUNT(*) FROM results").fetchone()
            if count > MAX_ROWS:
                raise ConfigError(
                    f"{self._where} holds {count:,} rows; at most {MAX_ROWS:,} are read",
                    field="out",
                    value=count,
                    limit=MAX_ROWS,
                    unit="rows",
                )
            cur = self._db.execute(
                f"SELECT {', '.join(COLUMNS)} FROM results ORDER BY model, label, overrides, devices"
            )
            return [self._decode(dict(zip(COLUMNS, values))) for values in cur]

    def _decode(self, row: dict[str, Any]) -> dict[str, Any]:
        origin = f"{self._where}, row {printable(str(row['key']))[:40]}"
        for column in ("overrides", "plan", "details"):
            text = row[column]
            if not isinstance(text, str) and (column == "overrides" or text is not None):
                raise self._bad(origin, column, text)
            row[column] = None if text is None else parse_text(text, "json", f"{origin}: {column}")
        column = _bad_column(row)
        if column is not None:
            raise self._bad(origin, column, row[column])
        return row

    def _bad(self, origin: str, column: str, value: Any) -> ConfigError:
        shown = printable(repr(value))[:80]
        return ConfigError(
            f"{origin}: {column} {shown} is not what nestplan sweep writes",
            field=column,
            value=shown,
            limit="a row written by nestplan sweep",
        )

    def close(self) -> None:
        with self._guard():
            self._db.close()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_run(value: Any) -> bool:
    """A case's run as the sweep stores it (plan/run.py run_figures): what a report shows of it."""
    if not isinstance(value, dict) or not isinstance(value.get("reliability"), dict):
        return False
    optional = (value.get("energy_MWh"), value.get("cost_usd"))
    return (
        all(_is_number(value.get(k)) for k in ("days", "gpu_hours"))
        and _is_number(value["reliability"].get("goodput"))
        and all(v is None or _is_number(v) for v in optional)
    )


ROW_CHECKS = {  # what a report relies on, per column
    "model": _is_text,
    "label": _is_text,
    "status": lambda v: v in STATUSES,
    "accelerator": lambda v: v is None or _is_text(v),
    "devices": _is_number,
    "hbm_GiB": lambda v: v is None or _is_number(v),
    "overrides": lambda v: isinstance(v, dict) and all(_is_number(x) for x in v.values()),
    "plan": lambda v: v is None or (isinstance(v, dict) and all(isinstance(v.get(k), (int, float)) for k in PLAN_KEYS)),
    "details": lambda v: v is None or (isinstance(v, dict) and ("run" not in v or _is_run(v["run"]))),
}
OK_ROW_CHECKS = {"tokens_per_s_per_device": _is_number, "mfu": _is_number}  # and for a solved case


def _bad_column(row: dict[str, Any]) -> str | None:
    """The first column a report could not show, or None."""
    checks = ROW_CHECKS | (OK_ROW_CHECKS if row["status"] == "ok" else {})
    return next((column for column, ok in checks.items() if not ok(row[column])), None)
