"""A lineage's own pipelines database (services/taskmanager/tasks/pipeline_database.py): its
directory is the running task's user's alone and root's between tasks; a newer task of the lineage
takes it from an older one; root follows no link a previous holder planted; the one database every
pipeline shared before is closed to pipelines."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.taskmanager.tasks.pipeline_database import LineageDatabase, prepare
from shared import pipeline_databases, safe_fs
from shared.settings import Settings
from shared.untrusted_code import UntrustedUser

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="handing directories to another user needs root")

DRIVER = 4244
LINEAGE = "a" * 32


def owners() -> safe_fs.Ownership:
    return safe_fs.Ownership(driver_uid=lambda u: u in (DRIVER, DRIVER + 1), driver_gid=lambda g: g == DRIVER)


def database(top: Path, uid: int = DRIVER) -> LineageDatabase:
    return LineageDatabase(top, owners(), UntrustedUser(f"drv-{uid}", uid, uid))


def owner_mode(p: Path) -> tuple[int, int]:
    st = p.lstat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


@root_only
def test_the_lineages_directory_is_its_tasks_while_it_runs_and_roots_after(tmp_path):
    top = tmp_path / "pipelines"
    db = database(top)
    url = db.grant(LINEAGE)
    assert url == f"sqlite:///{top / LINEAGE / 'pipelines.db'}"
    assert owner_mode(top) == (0, 0o711)  # drivers pass, never list
    assert owner_mode(top / LINEAGE) == (DRIVER, 0o700)
    (top / LINEAGE / "pipelines.db").write_bytes(b"rows")
    os.chown(top / LINEAGE / "pipelines.db", DRIVER, DRIVER)
    db.release()
    assert owner_mode(top / LINEAGE) == (0, 0o700)
    assert (top / LINEAGE / "pipelines.db").stat().st_uid == 0
    # The lineage's next task (another user of the pool) gets it back, with what it holds.
    again = database(top, DRIVER + 1)
    again.grant(LINEAGE)
    assert owner_mode(top / LINEAGE)[0] == DRIVER + 1
    assert (top / LINEAGE / "pipelines.db").stat().st_uid == DRIVER + 1
    assert (top / LINEAGE / "pipelines.db").read_bytes() == b"rows"


@root_only
def test_a_newer_task_of_the_lineage_keeps_it_when_the_older_one_ends(tmp_path):
    top = tmp_path / "pipelines"
    older, newer = database(top), database(top, DRIVER + 1)
    older.grant(LINEAGE)
    newer.grant(LINEAGE)
    older.release()
    assert owner_mode(top / LINEAGE) == (DRIVER + 1, 0o700)


@root_only
def test_root_follows_no_link_a_previous_holder_planted(tmp_path):
    top = tmp_path / "pipelines"
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "secret").write_text("x")
    db = database(top)
    db.grant(LINEAGE)
    (top / LINEAGE / "pipelines.db").unlink()
    (top / LINEAGE / "pipelines.db").symlink_to(victim / "secret")
    (top / LINEAGE / "pipelines.db-journal").symlink_to(victim / "secret")
    (top / LINEAGE / "sub").symlink_to(victim)
    db.release()
    database(top, DRIVER + 1).grant(LINEAGE)
    assert owner_mode(victim) == (0, 0o700) and (victim / "secret").stat().st_uid == 0
    # The links are gone, not followed; the database file is made anew.
    assert sorted(p.name for p in (top / LINEAGE).iterdir()) == ["pipelines.db"]
    assert owner_mode(top / LINEAGE / "pipelines.db") == (DRIVER + 1, 0o600)


@root_only
def test_a_link_in_place_of_the_lineages_directory_is_refused(tmp_path):
    top = tmp_path / "pipelines"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    top.mkdir()
    (top / LINEAGE).symlink_to(elsewhere)
    with pytest.raises(safe_fs.UnsafePath):
        database(top).grant(LINEAGE)
    assert owner_mode(elsewhere) == (0, 0o700)


def test_a_lineage_id_that_is_not_a_plain_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="lineage id"):
        database(tmp_path / "pipelines").grant("../catalog")


@root_only
def test_the_shared_database_of_before_is_closed_and_left_directories_taken_back(tmp_path):
    top = tmp_path / "pipelines"
    top.mkdir()
    os.chown(top, 0, DRIVER)
    os.chmod(top, 0o3770)  # what an older Headrace gave the drivers' group
    shared = top / "pipelines.db"
    shared.write_bytes(b"everyone's")
    os.chown(shared, DRIVER, DRIVER)
    os.chmod(shared, 0o660)
    (top / "pipelines.db-journal").symlink_to("/etc/passwd")
    left = top / LINEAGE
    left.mkdir(mode=0o700)
    os.chown(left, DRIVER, DRIVER)  # a killed TaskManager's task's
    busy = top / ("b" * 32)
    busy.mkdir(mode=0o700)
    os.chown(busy, DRIVER + 1, DRIVER + 1)
    prepare(top, owners(), in_use=lambda uid: uid == DRIVER + 1)
    assert owner_mode(top) == (0, 0o711)
    assert owner_mode(shared) == (0, 0o600) and shared.read_bytes() == b"everyone's"
    assert not os.path.lexists(top / "pipelines.db-journal")
    assert owner_mode(left) == (0, 0o700)
    assert busy.stat().st_uid == DRIVER + 1  # its task still runs


def test_a_job_gets_its_lineages_local_database_unless_a_database_is_named(tmp_path):
    local = Settings(home=tmp_path, pipeline_databases_dir=tmp_path / "pipelines")
    assert pipeline_databases.local_database(local, LINEAGE) == tmp_path / "pipelines" / LINEAGE / "pipelines.db"
    assert pipeline_databases.local_database(local, LINEAGE, {"catalog_url": "postgresql://db/x"}) is None
    configured = local.model_copy(update={"pipeline_catalog_url": "postgresql://db/all"})
    assert pipeline_databases.local_database(configured, LINEAGE) is None
    assert pipeline_databases.local_database(Settings(home=tmp_path), LINEAGE) is None


def test_the_driver_is_handed_its_lineages_database_unless_its_job_or_cluster_names_one(tmp_path):
    from services.taskmanager.drivers.home import DriverHome
    from services.taskmanager.drivers.sandbox import DriverSandbox
    from shared import task_protocol as tp

    top = tmp_path / "pipelines"
    sandbox = DriverSandbox(pipeline_databases=top)

    def handed(**fields) -> tp.TaskSpec:
        spec = tp.TaskSpec(
            job_id="b" * 32,
            vertex_id="v",
            execution_id="e1",
            attempt=1,
            parallelism=1,
            checkpoint_dir=str(tmp_path / "ck" / "live"),
            redis_url="redis://x",
            **fields,
        )
        home = DriverHome(tmp_path / "drivers", "d1", sandbox.users.sample)
        return sandbox.task_spec(spec, home)

    assert handed().catalog_url == f"sqlite:///{top / ('b' * 32) / 'pipelines.db'}"
    assert handed(lineage_id=LINEAGE).catalog_url == f"sqlite:///{top / LINEAGE / 'pipelines.db'}"
    assert handed(catalog_url="postgresql://db/all").catalog_url == "postgresql://db/all"
    assert handed(config={"catalog_url": "postgresql://db/mine"}).catalog_url == ""  # the driver takes the job's
    assert handed(kind="noop").catalog_url == ""


@root_only
def test_a_file_with_other_hard_links_is_not_handed_on(tmp_path):
    top = tmp_path / "pipelines"
    elsewhere = tmp_path / "root-only.db"
    elsewhere.write_text("root's")
    db = database(top)
    db.grant(LINEAGE)
    (top / LINEAGE / "pipelines.db").unlink()
    os.link(elsewhere, top / LINEAGE / "pipelines.db")  # as root: protected_hardlinks stops a driver
    db.release()
    database(top, DRIVER + 1).grant(LINEAGE)
    assert elsewhere.stat().st_uid == 0
