"""A driver's log, capped: its stdout and stderr (the runner's, its JVM's and Python workers') go
into a pipe this TaskManager reads, and are written to `driver-<id>.log`, which is rotated to
`.log.1`, `.log.2`, ... at `max_bytes` (settings driver_log_max_bytes, driver_log_backups). A
pipeline printing without end costs at most (backups + 1) x max_bytes of disk.

The driver never holds the file: a pipeline cannot reopen, truncate or grow it past the cap.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("headrace.taskmanager.driver_log")

CHUNK = 64 * 1024


class RotatingLog:
    def __init__(self, path: Path, *, max_bytes: int, backups: int):
        self.path, self.max_bytes, self.backups = path, max_bytes, backups

    def rotation(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def start(self, read_fd: int, name: str) -> threading.Thread:
        """Copy everything read from `read_fd` into the log until every writer has closed it."""
        t = threading.Thread(target=self._copy, args=(read_fd,), name=f"log-{name}", daemon=True)
        t.start()
        return t

    def _copy(self, fd: int) -> None:
        out = open(self.path, "ab", buffering=0)
        size = out.tell()
        try:
            while True:
                try:
                    chunk = os.read(fd, CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                while size + len(chunk) > self.max_bytes:
                    # Cut at a line end where there is one, so a line is not split over two files.
                    room = max(0, self.max_bytes - size)
                    cut = chunk.rfind(b"\n", 0, room) + 1 or room
                    out.write(chunk[:cut])
                    chunk = chunk[cut:]
                    out.close()
                    self._rotate()
                    out = open(self.path, "ab", buffering=0)
                    size = 0
                out.write(chunk)
                size += len(chunk)
        except OSError:
            log.warning("writing the driver log %s failed; the rest of its output is dropped", self.path, exc_info=True)
            _drain(fd)
        finally:
            out.close()
            os.close(fd)

    def _rotate(self) -> None:
        for n in range(self.backups - 1, 0, -1):
            if self.rotation(n).exists():
                os.replace(self.rotation(n), self.rotation(n + 1))
        os.replace(self.path, self.rotation(1))

    def tail(self, max_bytes: int) -> bytes:
        """The last `max_bytes` of the log, reaching into the previous file when the current one
        was just rotated."""
        parts: list[bytes] = []
        want = max_bytes
        for p in (self.path, self.rotation(1)):
            try:
                with open(p, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - want))
                    data = f.read()
            except OSError:
                continue
            parts.insert(0, data)
            want -= len(data)
            if want <= 0:
                break
        return b"".join(parts)


def _drain(fd: int) -> None:
    """Keep reading (and dropping) so the driver never blocks on a full pipe."""
    try:
        while os.read(fd, CHUNK):
            pass
    except OSError:
        pass
