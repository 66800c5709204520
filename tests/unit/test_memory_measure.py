"""The memory measure's pure parts: reading smaps_rollup's text, what a sample says of itself, and
when the watchdog's meter reads PSS again (on a fake clock, with the readings given)."""

from __future__ import annotations

import pytest

from services.taskmanager.memory import measure as mm
from shared.clock import FakeClock

GB = 1024**3

# /proc/<pid>/smaps_rollup of a Spark Python worker forked from its daemon (kernel 6.x): most of
# its resident pages are the daemon's, shared.
WORKER_ROLLUP = b"""\
5586d1a6b000-7ffd3a5f8000 ---p 00000000 00:00 0                          [rollup]
Rss:              102400 kB
Pss:               20480 kB
Pss_Dirty:         18000 kB
Pss_Anon:          17000 kB
Pss_File:           3480 kB
Pss_Shmem:             0 kB
Shared_Clean:       8000 kB
Shared_Dirty:      90000 kB
Private_Clean:       400 kB
Private_Dirty:      4000 kB
Referenced:       102400 kB
Anonymous:         94000 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
"""


def test_pss_and_rss_are_read_from_smaps_rollup_in_bytes():
    assert mm.parse_rollup(WORKER_ROLLUP) == (20480 * 1024, 102400 * 1024)


def test_a_rollup_without_pss_is_refused():
    with pytest.raises(ValueError, match="Pss"):
        mm.parse_rollup(b"Rss: 4 kB\n")


def test_a_sample_names_its_measure():
    assert mm.Sample(GB, mm.PSS, processes=14).label() == "PSS"
    assert mm.Sample(GB, mm.PSS, processes=14).describe() == "PSS summed over 14 processes"
    partly = mm.Sample(GB, mm.PSS, processes=14, by_rss=2)
    assert partly.label() == "PSS, RSS for 2"
    assert partly.describe() == "PSS summed over 14 processes, 2 of them by RSS (their PSS could not be read)"
    charge = mm.Sample(GB, mm.CGROUP, source="memory.current")
    assert (charge.label(), charge.describe()) == ("cgroup charge", "the cgroup's charge, memory.current")


class Readings:
    """What the meter reads: an RSS sum and a PSS sum set by the test, and how often PSS was read."""

    def __init__(self, rss: float, pss: float) -> None:
        self.rss, self.pss, self.pss_reads, self.clock = int(rss), int(pss), 0, FakeClock(0.0)
        self.machine_shmem = self.held_shmem = 0

    def read_pss(self, pids) -> mm.Sample:
        self.pss_reads += 1
        return mm.Sample(self.pss + self.held_shmem, mm.PSS, processes=len(pids), shmem=self.held_shmem)

    def meter(self) -> mm.ProcessMeter:
        return mm.ProcessMeter(
            lambda: [1, 2, 3],
            refresh_s=5.0,
            near_s=1.0,
            clock=self.clock.now,
            read_rss=lambda pids: self.rss,
            read_pss=self.read_pss,
            read_shmem=lambda: self.machine_shmem,
        )

    def at(self, now: float, *, rss: float | None = None, pss: float | None = None) -> "Readings":
        self.clock.t = now
        self.rss = int(rss) if rss is not None else self.rss
        self.pss = int(pss) if pss is not None else self.pss
        return self


def test_while_rss_is_within_the_limit_pss_is_only_read_for_the_figure_shown():
    r = Readings(rss=2 * GB, pss=1 * GB)
    meter = r.meter()
    assert meter.sample(3 * GB).used == 1 * GB and r.pss_reads == 1
    for t in (0.25, 1.0, 2.5, 4.75):  # the PSS within the limit whatever it is now: the last reading stands
        r.at(t, rss=2.9 * GB, pss=2.5 * GB)
        assert meter.sample(3 * GB).used == 1 * GB
    assert r.pss_reads == 1
    assert meter.sample(3 * GB) is meter.last
    r.at(5.0)
    assert meter.sample(3 * GB).used == int(2.5 * GB) and r.pss_reads == 2


def test_above_the_limit_by_rss_pss_is_read_every_second():
    r = Readings(rss=2.5 * GB, pss=1.2 * GB)
    meter = r.meter()
    meter.sample(3 * GB)
    r.at(0.25, rss=3.5 * GB)  # above the limit by RSS, grown by 1.0 GB < 1.8 GB of headroom
    meter.sample(3 * GB)
    r.at(0.75, pss=1.9 * GB)  # a worker wrote to pages it shared: PSS grew, RSS did not
    assert meter.sample(3 * GB).used == int(1.2 * GB) and r.pss_reads == 1
    r.at(1.0)
    assert meter.sample(3 * GB).used == int(1.9 * GB) and r.pss_reads == 2


def test_rss_growing_past_the_headroom_the_last_pss_left_reads_pss_at_once():
    r = Readings(rss=2.5 * GB, pss=1.2 * GB)
    meter = r.meter()
    meter.sample(3 * GB)
    r.at(0.25, rss=4.4 * GB, pss=3.1 * GB)  # grown by 1.9 GB: the PSS may have crossed the limit
    assert meter.sample(3 * GB).used == int(3.1 * GB) and r.pss_reads == 2


def test_without_a_limit_pss_is_read_only_for_the_figure_shown():
    r = Readings(rss=40 * GB, pss=1 * GB)
    meter = r.meter()
    for t in (0.0, 1.0, 2.0, 4.9, 5.0, 9.0):
        r.at(t)
        meter.sample(None)
    assert r.pss_reads == 2


def test_shared_memory_held_unmapped_is_read_at_once_when_the_machines_grows():
    """A memfd or /dev/shm file is in no RSS: the machine's shmem growth stands for it (issue 43)."""
    r = Readings(rss=1 * GB, pss=1 * GB)
    meter = r.meter()
    assert meter.sample(3 * GB).used == 1 * GB and r.pss_reads == 1
    r.at(0.25)
    r.machine_shmem = r.held_shmem = int(2.5 * GB)  # written into a memfd, never mapped
    sample = meter.sample(3 * GB)
    assert r.pss_reads == 2 and sample.used == 3.5 * GB and sample.shmem == 2.5 * GB
    assert (
        "2.5 GB of shared memory they hold unmapped"
        in mm.Sample(int(3.5 * GB), mm.PSS, processes=3, shmem=int(2.5 * GB), shmem_files=1).describe()
    )
    r.at(0.5)  # held, not grown: the bound keeps it, the reading stands only while within the limit
    assert meter.sample(5 * GB).used == 3.5 * GB and r.pss_reads == 2


def test_memfds_and_shm_files_count_unless_mapped(tmp_path):
    import mmap
    import os

    from services.taskmanager.memory.shmem_usage import unmapped_shmem

    fd = os.memfd_create("probe")
    try:
        os.write(fd, b"\x01" * (8 << 20))
        held, files = unmapped_shmem([os.getpid()], None)
        assert held >= 8 << 20 and files >= 1
        with mmap.mmap(fd, 8 << 20):
            assert unmapped_shmem([os.getpid()], None)[0] <= held - (8 << 20)
    finally:
        os.close(fd)
