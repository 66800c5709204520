"""Warm-up tokens: how many Spark drivers warm up at once on this machine, and in which order.

A JVM warming up uses a whole core for ~10 s; three at once on a 2-core machine (two TaskManagers
of `headrace up`, plus the replacement a task's take starts) each took 3-8 times longer, and a task
handed a starting driver waited for all of them; one per core is what the cores can carry. So a
driver starts warming only with a token (`WarmupTokens`: flock'ed lock files every TaskManager of
this user on the host shares; the kernel frees a dead process's token), held until the driver is
ready or gone (`hold_until_ready`).

Waiting warm-ups take their turn by rank (drivers/warm_pool.py `WarmPool.rank` says a pool's):
URGENT before REPLACING before SPARE. A waiting warm-up says so with a flock'ed claim file named by
its rank beside the tokens (`WarmupLine`, one place in line per pool); a warm-up of a higher rank
takes no token while a living claim of a lower one exists (a dead process's claim is unlocked, and
removed by the next one to look); and a niced warm-up holding a token gives it up to a waiting
urgent one and warms on niced. Without this, a just-started cluster's second TaskManager lost the
token to the first one's replacement, and a failover to it waited 14 s for a driver still warming.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Protocol

log = logging.getLogger("headrace.taskmanager.warm")

# A warm-up's rank in the machine-wide line for tokens (WarmPool.rank): lower goes first.
URGENT = 0  # the TaskManager has no ready driver and runs no task of its pool: the next task or failover lands here
REPLACING = 1  # no ready driver, but it runs the task it handed its driver to
SPARE = 2  # it has a ready driver and wants another
RANK_NAMES = {URGENT: "urgent", REPLACING: "replacing", SPARE: "spare"}
CLAIM_PREFIX = "waiting-rank-"
_claims = itertools.count(1)


class WarmupToken:
    def __init__(self, fd: int):
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock


class WarmupTokens:
    """At most `count` drivers warming up at once among all processes using `directory`."""

    def __init__(self, directory: Path | None, count: int | None):
        self.directory, self.count = directory, count  # count None: no limit

    @classmethod
    def unlimited(cls) -> "WarmupTokens":
        return cls(None, None)

    @classmethod
    def for_machine(cls, count: int | None = None) -> "WarmupTokens":
        """`count` tokens (Settings.warmup_concurrency; 0: no limit), else one per core (two JVMs
        warming up on 2 cores: both ready after 19 s, one after the other 24 s; three or more
        only slow each other down)."""
        if count is None:
            count = max(1, os.cpu_count() or 1)
        if count <= 0:
            return cls.unlimited()
        return cls(Path(tempfile.gettempdir()) / f"headrace-warmup-{os.getuid()}", count)

    def try_acquire(self, rank: int = URGENT) -> WarmupToken | None:
        """A free token, unless a warm-up of a lower (more urgent) `rank` is waiting for one."""
        directory = self.directory
        if self.count is None or directory is None:
            return WarmupToken(os.open(os.devnull, os.O_RDONLY))
        try:
            directory.mkdir(mode=0o700, exist_ok=True)
            if rank > URGENT and self.outranked(rank):
                return None
            for i in range(self.count):
                fd = os.open(directory / f"token-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return WarmupToken(fd)
                except BlockingIOError:
                    os.close(fd)
        except OSError:
            # An unusable token directory must not stop every warm-up: warm up unstaggered.
            log.warning("warm-up tokens in %s are unusable; not staggering", self.directory, exc_info=True)
            return WarmupToken(os.open(os.devnull, os.O_RDONLY))
        return None

    def wait_in_line(self, rank: int) -> "WaitingClaim | None":
        """Say that a warm-up of `rank` waits for a token: until the claim is dropped (or its
        process dies, which drops its flock) no warm-up of a higher rank takes one."""
        directory = self.directory
        if self.count is None or directory is None:
            return None
        try:
            directory.mkdir(mode=0o700, exist_ok=True)
            # Unique even when a pid comes back while a dead process's claim is still there.
            path = directory / f"{CLAIM_PREFIX}{rank}-{os.getpid()}-{next(_claims)}-{os.urandom(4).hex()}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file nobody else has: granted at once
        except OSError:
            log.warning("cannot queue a warm-up in %s; it takes its turn unranked", self.directory, exc_info=True)
            return None
        return WaitingClaim(rank, path, fd)

    def outranked(self, rank: int) -> bool:
        """Whether a living process waits with a claim of a lower rank than `rank`. Claims left
        by processes that died waiting (of any rank) are removed on the way."""
        if self.directory is None:
            return False
        found = False
        for path in self.directory.glob(f"{CLAIM_PREFIX}*.lock"):
            claim_rank = _claim_rank(path.name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # dropped meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                found = found or (claim_rank is not None and claim_rank < rank)  # its holder lives and waits
            else:
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return found


class WaitingClaim:
    """A warm-up waiting for a token, as a flock'ed file named by its rank (WarmupTokens.wait_in_line)."""

    def __init__(self, rank: int, path: Path, fd: int):
        self.rank, self.path = rank, path
        self._fd: int | None = fd

    def drop(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(fd)


def _claim_rank(name: str) -> int | None:
    try:
        return int(name[len(CLAIM_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return None


class WarmupLine:
    """One pool's place in the machine's line for tokens: at most one claim, of the rank it
    waits with now."""

    def __init__(self, tokens: WarmupTokens):
        self.tokens = tokens
        self._claim: WaitingClaim | None = None

    def wait(self, rank: int) -> None:
        if self._claim is not None and self._claim.rank == rank:
            return
        self.leave()
        self._claim = self.tokens.wait_in_line(rank)

    def leave(self) -> None:
        if self._claim is not None:
            self._claim.drop()
            self._claim = None


class WarmingDriver(Protocol):
    """What `hold_until_ready` reads of a driver (drivers/process.py DriverProcess; and `niced`
    where it has one)."""

    id: str
    ready: threading.Event
    exited: bool

    def alive(self) -> bool: ...


def hold_until_ready(
    tokens: WarmupTokens, d: WarmingDriver, token: WarmupToken, rank: int = URGENT, *, poll_s: float
) -> None:
    """Hold `token` until `d` is ready or gone (in a thread of its own). A niced warm-up of a rank
    above URGENT gives it up as soon as an urgent warm-up waits in line, and warms on at nice 19:
    beside the urgent one, at full priority, it only takes idle CPU anyway, and starved beside a
    busy task it would have kept the token for minutes."""

    def watch() -> None:
        try:
            while not d.ready.wait(poll_s) and not d.exited and d.alive():
                if rank > URGENT and getattr(d, "niced", False) and tokens.outranked(URGENT + 1):
                    log.info("warm driver %s gives its warm-up token to an urgent warm-up and warms on niced", d.id)
                    return
        finally:
            token.release()
        log.debug("driver %s gave back its warm-up token", d.id)

    threading.Thread(target=watch, name=f"warm-token-{d.id}", daemon=True).start()
