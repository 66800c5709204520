"""Pure rules of the driver sandbox: the driver's environment allow-list, the memory limit, its
watch (on given readings) and its failure cause, the log's rotation, and the permission reasoning
of the driver user."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from services.taskmanager.drivers import env as driver_env
from services.taskmanager.drivers.rotating_log import RotatingLog
from services.taskmanager.drivers.user import DriverUser, _allows
from services.taskmanager.memory import limit as memory_limit
from services.taskmanager.memory.measure import CGROUP, PSS, Sample
from shared import job_options

GB = 1024**3


def test_the_driver_environment_keeps_only_the_allow_list(tmp_path):
    environ = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "JAVA_HOME": "/jvm",
        "SPARK_HOME": "/s",
        "HEADRACE_CONFIG": "/run/tm-1.yaml",
        "HEADRACE_REDIS_URL": "redis://taskmanager:pw@h/0",
        "HEADRACE_CATALOG_URL": "postgresql://u:pw@db/h",
        "HEADRACE_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PYTHONPATH": "/extra",
        "HOME": "/root",
    }
    env = driver_env.driver_environment(environ, workdir=tmp_path, user="headrace-driver")
    assert not [k for k in env if k.startswith("HEADRACE_") and k != driver_env.MARK]
    assert "AWS_SECRET_ACCESS_KEY" not in env and "pw@" not in repr(env)
    assert env["HOME"] == env["TMPDIR"] == env[driver_env.MARK] == str(tmp_path)
    assert env["USER"] == "headrace-driver" and env["LC_ALL"] == "C" and env["SPARK_HOME"] == "/s"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(driver_env.IMPORT_ROOT), "/extra"]


@pytest.mark.parametrize(
    "raw, expected",
    [("3g", 3 * 1024**3), ("4 GB", 4 * 1024**3), ("1536m", 1536 * 1024**2), ("512m", 512 * 1024**2), (1024, 1024)],
)
def test_memory_sizes(raw, expected):
    assert job_options.memory_limit_bytes(raw) == expected


@pytest.mark.parametrize("raw", ["lots", "-1g", True, "3 parsecs", "1.5GiB"])
def test_bad_memory_sizes_are_refused_at_submission(raw):
    assert [p.option for p in job_options.problems({memory_limit.OPTION: raw})] == [memory_limit.OPTION]


def test_the_limit_is_the_jobs_else_the_clusters_else_driver_memory_plus_an_allowance():
    assert memory_limit.default_limit(None, "1g") == 3 * 1024**3
    assert memory_limit.default_limit("off", "1g") is None
    assert memory_limit.default_limit("5g", "1g") == 5 * 1024**3
    with pytest.raises(ValueError, match="driver_memory_limit"):
        memory_limit.default_limit("much", "1g")
    assert memory_limit.task_limit({memory_limit.OPTION: "2g"}, 3 * 1024**3) == 2 * 1024**3
    assert memory_limit.task_limit({memory_limit.OPTION: "off"}, 3 * 1024**3) is None
    assert memory_limit.task_limit({}, 3 * 1024**3) == 3 * 1024**3


def test_a_jobs_memory_limit_is_bounded_by_the_clusters_maximum():
    default = memory_limit.default_limit(None, "1g")
    maximum = memory_limit.maximum_limit(None, default=default, taskmanager_memory=8 * GB)
    assert maximum == 8 * GB
    assert memory_limit.task_limit({memory_limit.OPTION: "6g"}, default, maximum) == 6 * GB
    with pytest.raises(memory_limit.MemoryLimitRefused, match=r"1000.0 GB\) is above this cluster's maximum of 8.0 GB"):
        memory_limit.task_limit({memory_limit.OPTION: "1000g"}, default, maximum)
    with pytest.raises(memory_limit.MemoryLimitRefused, match="turns the task's memory limit off, which this cluster"):
        memory_limit.task_limit({memory_limit.OPTION: "off"}, default, maximum)
    # "off" only where the operator allows it, or where the cluster has no limit anyway.
    assert (
        memory_limit.task_limit(
            {memory_limit.OPTION: "off"},
            default,
            memory_limit.maximum_limit("off", default=default, taskmanager_memory=GB),
        )
        is None
    )
    assert memory_limit.task_limit({memory_limit.OPTION: "off"}, None, maximum) is None
    # The maximum is never below the cluster's own default.
    assert memory_limit.maximum_limit(None, default=12 * GB, taskmanager_memory=8 * GB) == 12 * GB
    assert memory_limit.maximum_limit("20g", default=default, taskmanager_memory=8 * GB) == 20 * GB
    with pytest.raises(ValueError, match="driver_memory_limit_max"):
        memory_limit.maximum_limit("lots", default=default, taskmanager_memory=8 * GB)


class Given:
    """A meter whose readings are given: PSS figures, or the kernel's OOM kills and peak."""

    def __init__(self, figures, *, kills=(), peak=None):
        self.figures, self.kills, self.peak_figure = iter(figures), iter(kills), peak

    def sample(self, limit):
        return next(self.figures)

    def oom_kills(self):
        return next(self.kills, 0)

    def peak(self):
        return self.peak_figure


def watch_until_fired(meter, limit):
    causes: list[str] = []
    fired = threading.Event()
    watch = memory_limit.MemoryWatch(
        limit=limit, meter=meter, on_exceeded=lambda c: (causes.append(c), fired.set()), interval_s=0.01
    )
    watch.start("t")
    assert fired.wait(5)
    time.sleep(0.05)
    return causes, watch


def test_the_watch_reports_once_with_the_figure_its_measure_and_the_option():
    pss = [Sample(n, PSS, processes=14) for n in (100, 200, 6 * GB, 7 * GB)]
    causes, watch = watch_until_fired(Given(pss), 3 * GB)
    assert causes == [causes[0]]
    assert causes[0].startswith(
        "the task's processes used 6.0 GB (PSS summed over 14 processes), above its "
        "limit of 3.0 GB (headrace.task.memory-limit); they were killed. "
    )
    assert 'raise the job option headrace.task.memory-limit (e.g. "7g")' in causes[0]
    assert watch.latest == pss[2]


def test_a_kill_by_the_kernel_reports_the_cgroups_peak():
    charge = [Sample(n, CGROUP, source="memory.current") for n in (GB, 2 * GB, 2 * GB)]
    causes, _ = watch_until_fired(
        Given(charge, kills=(0, 0, 1), peak=Sample(3 * GB, CGROUP, source="memory.peak")), 3 * GB
    )
    assert causes == [
        "the task's processes reached 3.0 GB (the cgroup's charge, memory.peak) at its limit of "
        "3.0 GB (headrace.task.memory-limit); the kernel's OOM killer ended them at the cgroup's "
        "memory.max. " + causes[0].split("memory.max. ", 1)[1]
    ]


def test_without_a_limit_the_watch_only_measures():
    fired = threading.Event()
    watch = memory_limit.MemoryWatch(
        limit=None,
        meter=Given([Sample(n * GB, PSS, processes=3) for n in range(1, 99)]),
        on_exceeded=lambda c: fired.set(),
        interval_s=0.01,
    ).start("t")
    time.sleep(0.3)
    watch.stop()
    assert not fired.is_set() and watch.latest is not None and watch.latest.used > GB


def test_a_log_is_rotated_at_its_cap_on_a_line_end_and_old_files_dropped(tmp_path):
    log = RotatingLog(tmp_path / "driver-d1.log", max_bytes=1000, backups=2)
    r, w = os.pipe()
    t = log.start(r, "d1")
    line = b"x" * 99 + b"\n"
    for _ in range(60):  # 6000 bytes
        os.write(w, line)
    os.write(w, b"headrace task phase: running\n")
    os.close(w)
    t.join(5)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["driver-d1.log", "driver-d1.log.1", "driver-d1.log.2"]
    assert all(f.stat().st_size <= 1000 and f.read_bytes().endswith(b"\n") for f in files)
    assert log.tail(200).endswith(b"headrace task phase: running\n")


def test_permissions_as_the_driver_user_sees_them(tmp_path):
    user = DriverUser("headrace-driver", 4242, 4242)
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    st = d.stat()
    assert not _allows(st, 4242, {4242}, stat.S_IXUSR)
    os.chmod(d, 0o711)
    assert _allows(d.stat(), 4242, {4242}, stat.S_IXUSR)
    assert not _allows(d.stat(), 4242, {4242}, stat.S_IRUSR)
    f = d / "secret"
    f.write_text("s")
    os.chmod(f, 0o600)
    assert user.blocked_at(f) in (f, *f.parents)  # the file, or the 0700 temporary directory above it
    assert user.blocked_at(Path("/usr/bin/env")) is None
    assert user.blocked_at(Path("/usr/bin"), write=True) == Path("/usr/bin")
