"""The log files one process may show over HTTP (docs/runbooks/logs.md).

A process serves only its own logs: its main log file (and that file's rotations, `x.log.1`),
plus every file of the directories it names (a TaskManager's drivers write theirs into one of
its own). A requested name is looked up in that listing, never joined to a path, so no name can
reach another file (`../etc/passwd`, a symlink, another service's log in the same directory).

Which file is the main log: the setting log_file (HEADRACE_LOG_FILE) if set, else the regular file this process's
stderr is written to (`headrace up` starts every service with stdout and stderr appended to
run_dir/logs/<name>.log), else none.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_FILE_ENV = "HEADRACE_LOG_FILE"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
DEFAULT_TAIL_BYTES = 256 * 1024
MAX_TAIL_BYTES = 4 * 1024 * 1024


def valid_name(name: str) -> bool:
    return bool(NAME.match(name)) and ".." not in name


def own_log_file(explicit: str | None = None) -> Path | None:
    """This process's main log file: `explicit` (the setting log_file), else the regular file
    its stderr goes to, else None (stderr is a terminal or a pipe)."""
    if explicit:
        return Path(explicit)
    try:
        target = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        return None
    try:
        return target if target.is_absolute() and stat.S_ISREG(target.stat().st_mode) else None
    except OSError:
        return None


@dataclass(frozen=True)
class LogFiles:
    main: Path | None = None
    directories: tuple[Path, ...] = ()

    @classmethod
    def of_this_process(cls, *directories: Path, main: str | None = None) -> "LogFiles":
        return cls(own_log_file(main), tuple(directories))

    def _candidates(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for d in self.directories:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if valid_name(e.name) and e.is_file(follow_symlinks=False):
                    found.setdefault(e.name, Path(e.path))
        if self.main is not None:
            try:
                siblings = list(os.scandir(self.main.parent))
            except OSError:
                siblings = []
            for e in siblings:
                rotation = e.name.startswith(self.main.name + ".") and e.name[len(self.main.name) + 1 :].isdigit()
                if (e.name == self.main.name or rotation) and valid_name(e.name) and e.is_file(follow_symlinks=False):
                    found[e.name] = Path(e.path)
        return found

    def listing(self) -> list[dict]:
        """Flink's shape: [{"name", "size", "mtime" (ms)}], the main log first, then newest first."""
        out: list[dict[str, Any]] = []
        for name, path in self._candidates().items():
            try:
                st = path.stat()
            except OSError:
                continue
            out.append({"name": name, "size": st.st_size, "mtime": int(st.st_mtime * 1000)})
        main = self.main.name if self.main is not None else None
        out.sort(key=lambda f: (f["name"] != main, -f["mtime"], f["name"]))
        return out

    def path_of(self, name: str) -> Path | None:
        return self._candidates().get(name) if valid_name(name) else None

    @property
    def main_name(self) -> str | None:
        return self.main.name if self.main is not None else None


def read_tail(path: Path, tail_bytes: int) -> bytes:
    """The last `tail_bytes` of the file, starting after a line break when it was cut."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - tail_bytes)
        f.seek(start)
        data = f.read(tail_bytes)
    if start > 0:
        cut = data.find(b"\n")
        if 0 <= cut < len(data) - 1:
            data = data[cut + 1 :]
    return data


def parse_tail(raw: str | None) -> int:
    """The `tail` query value in bytes; ValueError with the reason when unusable."""
    if raw is None or raw == "":
        return DEFAULT_TAIL_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"tail must be a number of bytes, got {raw!r}") from None
    if not 0 < value <= MAX_TAIL_BYTES:
        raise ValueError(f"tail must be between 1 and {MAX_TAIL_BYTES} bytes, got {value}")
    return value
