"""A class-data-sharing archive (JDK AppCDS) of the classes a Spark driver loads, shared by every
driver on the machine.

A driver JVM spends much of its start loading and verifying Spark's classes. With an archive of
them, built once per machine by a JVM that ran a warm-up and dumped what it had loaded at exit
(`-XX:ArchiveClassesAtExit`), a later JVM maps them instead (`-XX:SharedArchiveFile`): on 2
cores a SparkSession was ready in 2.5 s instead of 4.2 s and its first job took 0.95 s instead of
1.75 s (docs/benchmarks.md, "Cluster start"). The mapped pages are shared between all drivers.

The archive only fits the JVM and the Spark jars it was dumped from, so its file name carries a
key of both (java's path and mtime, pyspark's version and location); a new JDK or PySpark simply
gets a new archive. A JVM given an archive that does not fit ignores it (-Xshare:auto, the
default), so a stale or broken file costs nothing but the speed-up.

Built in the background by the first TaskManager that finds none (`ensure_started`), at the
lowest CPU priority, one builder per machine (a lock file), into a temporary name renamed into
place only once the dumping JVM has exited: a reader never sees half a file. Drivers started
before it exists run without it. The builder outlives a TaskManager that stops meanwhile (a
short-lived cluster would otherwise never get one), for BUILD_TIMEOUT_S at most.

    python -m services.taskmanager.runtime.class_archive --build PATH   (what the builder runs)
    python -m services.taskmanager.runtime.class_archive --ensure       (scripts/bootstrap: build the
        archive for the configured directory now, in the foreground, unless it exists, so that even
        the first `headrace up` on a new machine starts its drivers from it)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from shared import local_fs_jar
from shared.jars import DEFAULT_CACHE_DIR

if TYPE_CHECKING:
    from shared.spark_runtime import SparkRuntime

log = logging.getLogger("headrace.taskmanager.class_archive")

BUILD_TIMEOUT_S = 600.0


def java_binary() -> str | None:
    """The java that spark-submit runs (spark-class: $JAVA_HOME/bin/java, else java on PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def archive_path(directory: Path) -> Path | None:
    """Where the archive for this machine's JVM and PySpark lives (None without a java)."""
    java = java_binary()
    spec = importlib.util.find_spec("pyspark")  # not imported: the TaskManager has no use for it
    if java is None or spec is None or not spec.submodule_search_locations:
        return None
    version = importlib.metadata.version("pyspark")
    key = f"{java}:{os.stat(java).st_mtime_ns}:{version}:{list(spec.submodule_search_locations)[0]}"
    # The driver's class path holds Headrace's local file system once built: an archive dumped
    # without it would not fit (the JVM would ignore it), so its presence is part of the name.
    local_fs = local_fs_jar.built(DEFAULT_CACHE_DIR)
    key += f":{local_fs.name if local_fs else ''}"
    return directory / f"spark-driver-{version}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(path: Path | None) -> str:
    """The driver JVM's options that use the archive, if it has been built; else nothing."""
    if path is None or not path.is_file():
        return ""
    # The JVM's own notes about classes it could not share go nowhere: they are not problems.
    return f" -XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def runtime_java_options(runtime: "SparkRuntime") -> str:
    """java_options of the archive a Spark runtime names, if it names one."""
    if runtime.class_archive_dir is None:
        return ""
    return java_options(archive_path(runtime.class_archive_dir))


def ensure_started(path: Path | None, log_file: Path) -> subprocess.Popen | None:
    """Start building the archive in the background unless it exists or a builder runs."""
    if path is None or path.is_file():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{path.name}.*.tmp"):  # a builder killed before it finished
        if time.time() - stale.stat().st_mtime > BUILD_TIMEOUT_S:
            stale.unlink(missing_ok=True)
    lock = _try_lock(path)
    if lock is None:
        return None  # another TaskManager on this machine is building it
    os.close(lock)  # the builder takes the lock itself; a race only costs a second builder's check
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.taskmanager.runtime.class_archive", "--build", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        os.setpriority(os.PRIO_PGRP, proc.pid, 19)  # only the CPU the running drivers leave
    except OSError:
        pass
    log.info("building the Spark driver class archive %s in the background (log: %s)", path, log_file)
    return proc


def _try_lock(path: Path) -> int | None:
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def build(path: Path) -> int:
    """Run a driver's warm-up in a JVM that dumps its classes at exit; rename the dump into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _try_lock(path)
    if lock is None or path.is_file():
        return 0
    from .spark_session import build_spark, prepare_env
    from .warm_up import warm_up

    signal.alarm(int(BUILD_TIMEOUT_S))  # never left running: its JVM follows it when it dies
    prepare_env()
    work = Path(tempfile.mkdtemp(prefix="headrace-class-archive-"))
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    started = time.monotonic()
    try:
        spark = build_spark(
            2, work, extra_java_options=f" -XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off -Xlog:cds+dynamic=off"
        )
        warm_up(spark, work, 2)
        jvm = spark.sparkContext._gateway.proc
        spark.stop()
        jvm.stdin.close()  # the JVM exits when its stdin closes, and dumps the archive on the way
        code = jvm.wait(BUILD_TIMEOUT_S)
        if code != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            # A JVM that died while dumping may have left half a file: never put that in place.
            print(
                f"the JVM exited with {code} and wrote {'no' if not tmp.is_file() else 'an unusable'} archive at {tmp}",
                flush=True,
            )
            return 1
        os.replace(tmp, path)
        print(f"built {path} ({path.stat().st_size >> 20} MB) in {time.monotonic() - started:.1f} s", flush=True)
        return 0
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock)


def ensure(directory: Path) -> int:
    """Build the archive for this machine into `directory` now unless it is there (an install
    step: the TaskManagers' background build would make the first cluster's drivers start slowly)."""
    path = archive_path(directory)
    if path is None:
        print("class archive: no java or pyspark found; drivers will start without one", flush=True)
        return 0
    if path.is_file():
        print(f"class archive: {path} is there", flush=True)
        return 0
    log_file = path.with_name(path.name + ".log")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_file, "wb")  # Spark's own start-up chatter stays out of the installer's
    except OSError as exc:
        print(
            f"class archive: cannot write in {path.parent} ({exc}); set HEADRACE_DRIVER_CLASS_ARCHIVE_DIR "
            f"to a writable directory",
            flush=True,
        )
        return 1
    print(
        f"class archive: building {path} (a Spark warm-up in a JVM that dumps its classes: "
        f"about half a minute; log: {log_file})",
        flush=True,
    )
    with out:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "services.taskmanager.runtime.class_archive", "--build", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S + 30,
            ).returncode
        except subprocess.TimeoutExpired:  # build() ends itself by alarm first; this is a backstop
            code = 1
    if code != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        print(
            "class archive: the build failed (exit %s); last lines of its log:\n  %s" % (code, "\n  ".join(tail)),
            flush=True,
        )
    elif path.is_file():
        print(f"class archive: built ({path.stat().st_size >> 20} MB)", flush=True)
    else:
        print("class archive: another process is building it; TaskManagers will use it once it is there", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.runtime.class_archive")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--build", type=Path, help="where the archive goes")
    what.add_argument(
        "--ensure",
        action="store_true",
        help="build the archive in the configured directory (HEADRACE_DRIVER_CLASS_ARCHIVE_DIR, "
        "default ~/.cache/headrace/cds) unless it is there",
    )
    args = p.parse_args(argv)
    if args.ensure:
        from shared.settings import load_settings

        settings = load_settings()
        if not settings.driver_class_archive:
            print("class archive: off (HEADRACE_DRIVER_CLASS_ARCHIVE=false)", flush=True)
            return 0
        return ensure(settings.driver_class_archive_dir)
    return build(args.build)


if __name__ == "__main__":
    sys.exit(main())
