"""The pool of users pipeline code runs as (shared/sandbox_users.py): no two holders share a user,
whatever process or cluster of the machine they are; a user is taken in turn; what a holder left
(its processes, its files in /dev/shm and /tmp) is gone before the next one gets it."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared.sandbox_users import SandboxUsers, SandboxUsersError, processes_of
from tests.servers import IN_CI, missing

GROUP = "headrace-driver"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="the pool's users are switched to by root")


SIZE = 6


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def pool():
    try:
        pwd.getpwnam(f"{GROUP}-{SIZE - 1}")
    except KeyError:
        missing("the drivers' users (run scripts/bootstrap as root)")
    # The machine's own locks: a user a running cluster's driver holds is never handed out (nor
    # scrubbed) here.
    return SandboxUsers(GROUP, SIZE)


def test_holders_never_share_a_user_and_the_pool_says_when_it_is_empty(pool):
    leases = []
    with pytest.raises(SandboxUsersError, match=f"all {SIZE} drivers' users of this machine are in use"):
        while True:
            leases.append(pool.acquire("test"))
    try:
        assert leases and len({lease.user.uid for lease in leases}) == len(leases)
        # Another process of the machine (another cluster's TaskManager) sees the same locks.
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from shared.sandbox_users import SandboxUsers; SandboxUsers({GROUP!r}, {SIZE}).acquire('other')",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )
        assert f"all {SIZE} drivers' users" in other.stderr
        given_back = leases.pop()
        given_back.release()
        again = pool.acquire("test")
        assert again.user.uid == given_back.user.uid
        leases.append(again)
    finally:
        for lease in leases:
            lease.release()


def test_users_are_taken_in_turn(pool):
    # The whole pool scripts/bootstrap makes: a user given back comes again next only when every
    # other one is held, and with six of them the clusters of other tests here sometimes hold five.
    pool = SandboxUsers(GROUP, 32) if user_exists(f"{GROUP}-31") else pool
    first = pool.acquire("test")
    first.release()
    second = pool.acquire("test")
    second.release()
    assert second.user.uid != first.user.uid, "a user given back is not the next to come again"


def test_what_a_holder_left_is_gone_before_the_next_holder(pool):
    lease = pool.acquire("test")
    user = lease.user
    shm = Path(f"/dev/shm/headrace-test-{os.getpid()}")
    tmp = Path(f"/tmp/headrace-test-{os.getpid()}")
    sleeper = subprocess.Popen(["sleep", "600"], **user.popen_kwargs(), start_new_session=True)
    for path in (shm, tmp):
        path.write_text("left behind")
        os.chown(path, user.uid, user.gid)
    lease.release()
    deadline = time.monotonic() + 10
    while sleeper.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper.poll() is not None and processes_of(user.uid) == []
    assert not shm.exists() and not tmp.exists()


def test_a_lock_directory_others_may_write_is_refused(tmp_path, pool):
    unsafe = tmp_path / "open"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    with pytest.raises(SandboxUsersError, match="that no one else may write"):
        SandboxUsers(GROUP, 3, lock_dir=unsafe).acquire("test")


def test_a_lineage_directory_a_holder_kept_is_taken_back_before_the_user_is_handed_out(pool, tmp_path):
    from shared.sandbox_users import RECLAIM, registered_name

    top = tmp_path / "pipelines"
    top.mkdir(mode=0o711)
    lease = pool.acquire("test")
    user = lease.user
    kept = top / ("a" * 32)  # what a TaskManager killed with -9 left with its task's user
    kept.mkdir(mode=0o700)
    (kept / "pipelines.db").write_text("rows")
    for path in (kept, kept / "pipelines.db"):
        os.chown(path, user.uid, user.gid)
    lease.release()
    pool.reclaim_below(top)
    try:
        pool.take_back_directories(user.uid)  # what acquire does before it hands the user out
        assert (kept.stat().st_uid, stat.S_IMODE(kept.stat().st_mode)) == (0, 0o700)
        assert (kept / "pipelines.db").stat().st_uid == 0 and (kept / "pipelines.db").read_text() == "rows"
    finally:
        (pool.lock_dir / RECLAIM / registered_name(top)).unlink()
