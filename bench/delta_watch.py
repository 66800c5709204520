"""What a Delta table's log says as it grows, read without Spark: the rows committed so far and the
highest event number visible, commit by commit (the Delta benchmarks' watcher).

Every commit is a JSON file `_delta_log/<version>.json`; its `add` actions carry per-file stats
(numRecords, and min/max of the first columns), which both Headrace's sink and Delta's own
streaming sink write. A reader sees a commit once its file exists, so the time a poll first finds
it is when its rows became visible."""

from __future__ import annotations

import json
from pathlib import Path


class LogWatch:
    def __init__(self, table: Path, column: str = "n"):
        self.log = table / "_delta_log"
        self.column = column
        self.version = -1
        self.rows = 0
        self.max_value = -1
        self.commits_with_rows = 0

    def poll(self) -> bool:
        """Read the commits that appeared since the last poll; True when there were any."""
        grew = False
        while True:
            f = self.log / f"{self.version + 1:020d}.json"
            try:
                text = f.read_text()
            except FileNotFoundError:
                return grew
            grew, self.version = True, self.version + 1
            added = 0
            for line in text.splitlines():
                action = json.loads(line) if line.strip() else {}
                add = action.get("add")
                if not add or not add.get("dataChange", True):
                    continue
                stats = json.loads(add.get("stats") or "{}")
                added += int(stats.get("numRecords", 0))
                top = (stats.get("maxValues") or {}).get(self.column)
                if top is not None:
                    self.max_value = max(self.max_value, int(top))
            self.rows += added
            self.commits_with_rows += 1 if added else 0


def data_files(table: Path) -> int:
    """Data files on disk (the log and `_`/`.`-prefixed names aside)."""
    count = 0
    for f in table.rglob("*.parquet"):
        rel = f.relative_to(table).parts
        if not any(p.startswith(("_", ".")) for p in rel):
            count += 1
    return count
