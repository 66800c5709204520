"""Which class archive a driver uses, and when a builder starts (no JVM here)."""

from __future__ import annotations

import fcntl
import os

from services.taskmanager.runtime import class_archive


def test_the_archive_name_is_keyed_by_jvm_and_pyspark(tmp_path):
    path = class_archive.archive_path(tmp_path)
    assert path is not None and path.parent == tmp_path
    assert path.name.startswith("spark-driver-") and path.suffix == ".jsa"
    assert class_archive.archive_path(tmp_path) == path  # stable for one machine


def test_drivers_use_the_archive_only_once_it_exists(tmp_path):
    path = tmp_path / "a.jsa"
    assert class_archive.java_options(path) == ""
    assert class_archive.java_options(None) == ""
    path.write_bytes(b"x")
    assert f"-XX:SharedArchiveFile={path}" in class_archive.java_options(path)


def test_no_builder_when_the_archive_exists_or_another_builds_it(tmp_path):
    path = tmp_path / "a.jsa"
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "another TaskManager" is building it
    try:
        assert class_archive.ensure_started(path, tmp_path / "build.log") is None
    finally:
        os.close(fd)
    path.write_bytes(b"x")
    assert class_archive.ensure_started(path, tmp_path / "build.log") is None
    assert class_archive.ensure_started(None, tmp_path / "build.log") is None


def test_the_installer_step_builds_nothing_when_the_archive_is_there(tmp_path, capsys):
    path = class_archive.archive_path(tmp_path)
    path.write_bytes(b"x")
    assert class_archive.ensure(tmp_path) == 0
    assert "is there" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no lock, no log, no build


def test_the_installer_step_says_so_when_it_cannot_write(tmp_path, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")  # a directory cannot be made below a file
    assert class_archive.ensure(blocked / "cds") == 1
    assert "HEADRACE_DRIVER_CLASS_ARCHIVE_DIR" in capsys.readouterr().out
