"""Root's file operations where a driver may have written (shared/safe_fs.py): a link is refused,
never followed; a directory a driver's user owns where root's belongs is taken back; trees are
walked, chowned and mirrored without following what a pipeline planted (issue 43)."""

from __future__ import annotations

import os
import stat

import pytest

from shared import safe_fs

DRIVER = 4242  # a uid standing for a driver's user


def owners() -> safe_fs.Ownership:
    return safe_fs.Ownership(driver_uid=lambda uid: uid == DRIVER, driver_gid=lambda gid: gid == DRIVER)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def test_a_link_where_a_directory_belongs_is_refused_not_followed(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "job").symlink_to(tmp_path / "elsewhere")
    with safe_fs.opened(safe_fs.open_trusted(tmp_path / "root")) as fd:
        with pytest.raises(safe_fs.UnsafePath, match="symbolic link"):
            safe_fs.ensure_dirs(fd, "job/vertex/live", owners())
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_missing_components_are_made_closed_to_drivers_and_traversable(tmp_path):
    with safe_fs.opened(safe_fs.open_trusted(tmp_path)) as fd:
        os.close(safe_fs.ensure_dirs(fd, "job/vertex/live", owners()))
    for d in ("job", "job/vertex", "job/vertex/live"):
        mode = stat.S_IMODE((tmp_path / d).stat().st_mode)
        assert mode & 0o022 == 0 and mode & 0o001, (d, oct(mode))
    with safe_fs.opened(safe_fs.open_trusted(tmp_path)) as fd:
        with pytest.raises(FileNotFoundError):
            safe_fs.ensure_dirs(fd, "other/x", owners(), create=False)


@root_only
def test_a_directory_a_driver_owns_is_taken_back(tmp_path):
    (tmp_path / "job").mkdir(mode=0o777)
    os.chown(tmp_path / "job", DRIVER, DRIVER)
    os.chmod(tmp_path / "job", 0o777)
    with safe_fs.opened(safe_fs.open_trusted(tmp_path)) as fd:
        os.close(safe_fs.ensure_dirs(fd, "job", owners()))
    st = (tmp_path / "job").stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o022 == 0


@root_only
def test_chown_tree_takes_back_only_the_drivers_entries_and_follows_no_link(tmp_path):
    top = tmp_path / "snap"
    (top / "spark" / "state").mkdir(parents=True)
    (top / "spark" / "state" / "1.delta").write_bytes(b"x")
    victim = tmp_path / "victim"
    victim.write_text("root's")
    victim.chmod(0o600)
    (top / "spark" / "link").symlink_to(victim)
    for p in (top, top / "spark", top / "spark" / "state", top / "spark" / "state" / "1.delta"):
        os.chown(p, DRIVER, DRIVER)
    os.chmod(top / "spark" / "state" / "1.delta", 0o600)
    os.lchown(top / "spark" / "link", DRIVER, DRIVER)
    with safe_fs.opened(safe_fs.open_trusted(top)) as fd:
        assert safe_fs.chown_tree(fd, 0, 0, only=lambda uid: uid == DRIVER, files_readable=True) == 5
    assert {p.lstat().st_uid for p in top.rglob("*")} | {top.stat().st_uid} == {0}
    assert stat.S_IMODE((top / "spark" / "state" / "1.delta").stat().st_mode) == 0o644
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "root's"


def test_link_tree_mirrors_files_and_leaves_links_out(tmp_path):
    src = tmp_path / "src"
    (src / "spark" / "commits").mkdir(parents=True)
    (src / "_metadata").write_text("{}")
    (src / "spark" / "commits" / "0").write_text("c")
    (src / "spark" / "evil").symlink_to("/etc/shadow")
    os.mkfifo(src / "spark" / "fifo")
    (tmp_path / "view").mkdir()
    with safe_fs.opened(safe_fs.open_trusted(src)) as s, safe_fs.opened(safe_fs.open_trusted(tmp_path / "view")) as d:
        assert safe_fs.link_tree(s, d) == (2, 3)
    view = tmp_path / "view"
    assert sorted(str(p.relative_to(view)) for p in view.rglob("*")) == [
        "_metadata",
        "spark",
        "spark/commits",
        "spark/commits/0",
    ]
    assert (view / "spark" / "commits" / "0").stat().st_ino == (src / "spark" / "commits" / "0").stat().st_ino


def test_read_file_refuses_a_link_and_a_fifo_and_bounds_the_size(tmp_path):
    (tmp_path / "meta").write_text("x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "meta")
    os.mkfifo(tmp_path / "fifo")
    with safe_fs.opened(safe_fs.open_trusted(tmp_path)) as fd:
        assert safe_fs.read_file(fd, "meta", max_bytes=100)[0] == b"x" * 100
        with pytest.raises(ValueError, match="more than the 99"):
            safe_fs.read_file(fd, "meta", max_bytes=99)
        with pytest.raises(OSError):
            safe_fs.read_file(fd, "link", max_bytes=100)
        with pytest.raises(safe_fs.UnsafePath, match="not a regular file"):
            safe_fs.read_file(fd, "fifo", max_bytes=100)


def test_write_file_replaces_atomically_and_never_writes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "_metadata").symlink_to(victim)
    with safe_fs.opened(safe_fs.open_trusted(tmp_path / "d")) as fd:
        safe_fs.write_file(fd, "_metadata", b"{}", mode=0o644)
    assert victim.read_text() == "keep"
    assert not (tmp_path / "d" / "_metadata").is_symlink() and (tmp_path / "d" / "_metadata").read_text() == "{}"


def test_make_dir_refuses_a_name_that_is_there(tmp_path):
    (tmp_path / "t").symlink_to("/")
    with safe_fs.opened(safe_fs.open_trusted(tmp_path)) as fd:
        with pytest.raises(FileExistsError):
            safe_fs.make_dir(fd, "t", mode=0o700, uid=os.geteuid(), gid=os.getegid())
        with pytest.raises(safe_fs.UnsafePath):
            safe_fs.make_dir(fd, "t", mode=0o700, uid=os.geteuid(), gid=os.getegid(), exist_ok=True)


def test_a_flock_held_elsewhere_is_waited_for_within_a_bound_and_named(tmp_path):
    import fcntl
    import time

    holder = os.open(tmp_path, os.O_RDONLY)
    waiter = os.open(tmp_path, os.O_RDONLY)  # another open file description: flocks conflict
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="the test's directory stayed locked"):
            safe_fs.lock_exclusive(waiter, "the test's directory", timeout_s=0.2)
        assert time.monotonic() - started < 5
        fcntl.flock(holder, fcntl.LOCK_UN)
        safe_fs.lock_exclusive(waiter, "the test's directory", timeout_s=0.2)  # free: taken at once
    finally:
        os.close(holder)
        os.close(waiter)
