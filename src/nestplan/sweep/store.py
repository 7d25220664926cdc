"""The result store: one SQLite file, one row per case keyed by the hash of its inputs.

Only the sweep's driver writes, one transaction per finished case, so a driver or worker
killed at any moment leaves every finished case on disk and none twice (the key is the
primary key; a re-run inserts only what is missing). WAL journaling lets `sweep report`
read while a sweep runs.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

COLUMNS = ("key", "model", "cluster", "label", "accelerator", "overrides", "devices", "global_batch_size",
           "seq_len", "hbm_GiB", "status", "tokens_per_s", "tokens_per_s_per_device", "step_time_s", "mfu", "peak_memory_GiB", "plan",
           "details", "error", "solve_time_s", "finished_at")
RESULT_FIELDS = ("status", "tokens_per_s", "tokens_per_s_per_device", "step_time_s", "mfu", "peak_memory_GiB",
                 "plan", "details", "error")   # what a case produces (solve time and finish time aside)

SCHEMA = """CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY, model TEXT, cluster TEXT, label TEXT, accelerator TEXT, overrides TEXT, devices INTEGER,
    global_batch_size INTEGER, seq_len INTEGER, hbm_GiB REAL, status TEXT, tokens_per_s REAL,
    tokens_per_s_per_device REAL, step_time_s REAL, mfu REAL, peak_memory_GiB REAL, plan TEXT, details TEXT, error TEXT,
    solve_time_s REAL, finished_at REAL)"""


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(SCHEMA)
        self._db.commit()

    def keys(self) -> set[str]:
        return {row[0] for row in self._db.execute("SELECT key FROM results")}

    def put(self, inputs: dict[str, Any], result: dict[str, Any]) -> bool:
        """Record one finished case (committed at once); False when it was already there."""
        row = {"key": inputs["key"], "model": inputs["model"], "cluster": inputs["cluster"], "label": inputs["label"],
               "accelerator": inputs["accelerator"], "overrides": json.dumps(inputs["overrides"], sort_keys=True),
               "devices": inputs["devices"],
               "global_batch_size": inputs["global_batch_size"], "seq_len": inputs["seq_len"],
               "hbm_GiB": inputs["hbm_GiB"], "solve_time_s": result.get("solve_time_s"), "finished_at": time.time()}
        for f in RESULT_FIELDS:
            value = result.get(f)
            row[f] = json.dumps(value, sort_keys=True) if f in ("plan", "details") and value is not None else value
        cur = self._db.execute(f"INSERT OR IGNORE INTO results ({', '.join(COLUMNS)}) VALUES "
                               f"({', '.join('?' for _ in COLUMNS)})", [row[c] for c in COLUMNS])
        self._db.commit()
        return cur.rowcount == 1

    def rows(self) -> Iterator[dict[str, Any]]:
        cur = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM results ORDER BY model, label, overrides, devices")
        for values in cur:
            row = dict(zip(COLUMNS, values))
            row["overrides"] = json.loads(row["overrides"])
            row["plan"] = json.loads(row["plan"]) if row["plan"] else None
            row["details"] = json.loads(row["details"]) if row["details"] else None
            yield row

    def close(self) -> None:
        self._db.close()
