"""Fixtures shared by the whole suite.

Real-server fixtures start throwaway servers on free ports (redis-server) or create a throwaway
database (PostgreSQL at HEADRACE_TEST_PG, default the local trust-auth server). Locally a test
skips when a server is absent; under CI (CI=true) it fails instead, so a missing install step
can never pass silently.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.clusters import SUITE_JVM_OPTIONS
from tests.image_prebuild import COMPOSE_TEST, PREBUILD, PREBUILD_DIR_ENV, Prebuild, PrebuildWatch
from tests.servers import KafkaServer, RedisServer, ZooKeeperServer, fresh_pg_database, missing

# pytest keeps its temporary directories 0700 to others (and resets that at every session's
# start), so a driver running as the unprivileged driver user could not reach a cluster whose
# home is one of them. Test clusters run drivers as the test's own user unless the environment
# says otherwise; tests/integration/test_driver_sandbox.py starts its own with the driver user.
os.environ.setdefault("HEADRACE_DRIVER_USER", "")
# Every JVM the suite starts (drivers, planners, ZooKeeper, Spark standalone, Flink's CLI, the
# compose stack's) runs with SUITE_JVM_OPTIONS (C1 only, the serial collector, no bytecode
# verification), but for Flink's CLI and the demo, which keep verifying (tests/clusters.py says why).
# Benchmarks run the JVMs as users do. JDK_JAVA_OPTIONS= (empty) runs the suite with the JVMs' defaults.
os.environ.setdefault("JDK_JAVA_OPTIONS", SUITE_JVM_OPTIONS)
# Warm drivers in reserve skip their warm-up query (Settings.warm_up_query): a third of the
# drivers the suite's clusters start are never used before their module stops its cluster, and
# the query is about half of a warm driver's CPU (docs/benchmarks.md, "The suite's warm drivers
# without their warm-up query"). tests/integration/test_up_warm_drivers.py and test_runner.py
# run it as users do.
os.environ.setdefault("HEADRACE_WARM_UP_QUERY", "false")
# Where a test runs it, one micro-batch of it rather than Settings.warm_up_batches' 150 (~30 s of a
# core per driver); `headrace up` in test_up_warm_drivers.py runs the default, and
# test_connectors.py the query for several batches.
os.environ.setdefault("HEADRACE_WARM_UP_BATCHES", "1")
# No spare restore-check planner from each dispatcher's start (Settings.warm_planner): most of the
# suite's clusters and dispatcher apps never check a changed pipeline, and a spare's JVM costs about
# what a cold check does. The deployments drill and tests/integration/test_warm_planner.py turn it on.
os.environ.setdefault("HEADRACE_WARM_PLANNER", "false")


@pytest.fixture
def redis_server(tmp_path):
    if not shutil.which("redis-server"):
        missing("redis-server")
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def pg_url():
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module")
def pg_url_module():
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


# Catalogs already at the migrations' head, for tests that want one per test: a copy of a catalog
# migrated once per test process. Running the migrations was most of such a test's time (0.4-0.7 s
# of CPU-bound set-up each on PostgreSQL, tests/integration/test_dispatcher_api.py's 57 of them).
def _migrate(url: str) -> None:
    from shared.catalog.db import Catalog

    catalog = Catalog(url)
    try:
        catalog.migrate()
    finally:
        catalog.dispose()  # no connection may be left on a template that is copied


@pytest.fixture(scope="session")
def _migrated_pg_template():
    with fresh_pg_database() as url:
        _migrate(url)
        yield url.rsplit("/", 1)[1]


@pytest.fixture(scope="session")
def _migrated_sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalog-template") / "catalog.db"
    _migrate(f"sqlite:///{path}")
    return path


@pytest.fixture
def migrated_pg_url(_migrated_pg_template):
    """A fresh PostgreSQL catalog at the migrations' head."""
    with fresh_pg_database(template=_migrated_pg_template) as url:
        yield url


@pytest.fixture
def migrated_sqlite_url(_migrated_sqlite_template, tmp_path) -> str:
    """A fresh SQLite catalog at the migrations' head."""
    path = tmp_path / "catalog.db"
    shutil.copy(_migrated_sqlite_template, path)  # its owner-only mode too
    return f"sqlite:///{path}"


LOG_TAIL_LINES = 40

# Under pytest-xdist (`-n N --dist loadfile --no-loadscope-reorder`, pyproject.toml) each unit of work
# runs whole on one worker, and a worker takes the next group when it is free: the longest kinds
# go first so that the workers end together, the unit tests' many small modules fill in at the
# end. The compose-stack test waits for its images, built in the background from collection on
# (tests/image_prebuild.py).
RUN_ORDER = ("tests/e2e/", "tests/integration/", COMPOSE_TEST, "tests/browser/", "tests/component/", "tests/unit/")


# Under xdist the end-to-end drills are one unit of work, run in order by one worker:
# they keep 2 cores busy with Spark drivers and JVMs, and two of them side by side each took 1.8
# times as long. The other worker takes the rest module by module (a module's cluster starts once),
# and those are half waiting (timeouts, windows, failovers): they fill the drills' idle time.
DRILLS = "tests/e2e/"


# A test's tier is its folder: the marker comes from there and only from there (no module declares
# its tier's marker, so none can forget it or give another), and every tier that needs real servers,
# Spark or a browser is `slow`: `python3 -m pytest -m "not slow"` is the fast loop of unit and
# component tests (README, "Development"). pyproject.toml registers the markers.
TESTS_DIR = Path(__file__).resolve().parent
FOLDER_MARKERS = {
    "unit": ("unit",),
    "component": ("component",),
    "integration": ("integration", "slow"),
    "e2e": ("e2e", "slow"),
    "browser": ("browser", "slow"),
}


def folder_markers(path: Path) -> tuple[str, ...]:
    """The markers of a test module at `path`: its tier's, from the folder under tests/ it is in."""
    try:
        tier = Path(path).resolve().relative_to(TESTS_DIR).parts[0]
    except ValueError:  # not under tests/
        return ()
    return FOLDER_MARKERS.get(tier, ())


def pytest_itemcollected(item):
    for name in folder_markers(item.path):
        item.add_marker(getattr(pytest.mark, name))


def pytest_xdist_make_scheduler(config, log):
    """A module is one unit of work (its cluster starts once), and all of tests/e2e/ is one.

    xdist's own `--dist loadgroup` marks cannot do it under pytest 9 (the group suffix it writes
    into a test's id is no longer read), so the grouping is this scheduler's, on xdist's public hook.
    """
    from xdist.scheduler import LoadFileScheduling

    class DrillsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "drills" if nodeid.startswith(DRILLS) else super()._split_scope(nodeid)

    return DrillsTogether(config, log)


def _run_rank(nodeid: str) -> int:
    return next(
        (rank for rank, prefix in reversed(list(enumerate(RUN_ORDER))) if nodeid.startswith(prefix)), len(RUN_ORDER)
    )


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if not _xdist_worker(config) and (config.getoption("numprocesses", None) or 0) > 0:
        # The controller: its workers inherit the directory of the build it may start.
        os.environ[PREBUILD_DIR_ENV] = tempfile.mkdtemp(prefix="headrace-prebuild-")


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    """Under xdist, modules in RUN_ORDER; in one process, the compose-stack test last. Its images
    start building in the background (tests/image_prebuild.py): a cold build costs the suite
    minutes otherwise."""
    if _xdist_worker(config):
        items.sort(key=lambda item: _run_rank(item.nodeid))  # stable: a module's tests keep their order
    else:  # in one process the collection's order, with the compose-stack test last
        items.sort(key=lambda item: item.nodeid.startswith(COMPOSE_TEST))
    if config.getoption("collectonly") or not any(item.nodeid.startswith(COMPOSE_TEST) for item in items):
        return
    if _xdist_worker(config):
        config.stash[PREBUILD] = PrebuildWatch(Path(os.environ[PREBUILD_DIR_ENV]))
    else:
        config.stash[PREBUILD] = Prebuild(Path(tempfile.mkdtemp(prefix="headrace-prebuild-")))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller starts the background build once, when a worker has the compose test."""
    config = node.config
    if PREBUILD not in config.stash and any(nodeid.startswith(COMPOSE_TEST) for nodeid in ids):
        config.stash[PREBUILD] = Prebuild(Path(os.environ[PREBUILD_DIR_ENV]))


def pytest_unconfigure(config):
    prebuild = config.stash.get(PREBUILD, None)
    if isinstance(prebuild, Prebuild):
        prebuild.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """When a test on a multi-process cluster fails, the report carries the tail of every
    service's log: a failure seen only in CI must be diagnosable from CI's output alone."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if isinstance(cluster, tuple):  # fixtures that also hand out e.g. a sink database URL
        cluster = next((c for c in cluster if hasattr(c, "children")), None)
    if not report.failed or cluster is None or not hasattr(cluster, "children"):
        return
    logs = [(child.name, child.log) for child in cluster.children]
    # The newest Spark driver logs too: a task stuck before RUNNING is explained there.
    drivers = sorted(
        Path(cluster.settings.home).glob("work/taskmanagers/*/logs/driver-*.log"), key=lambda p: p.stat().st_mtime
    )[-3:]
    logs += [(f"{d.parent.parent.name} {d.stem}", d) for d in drivers]
    for name, path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError as exc:
            lines = [f"(log unreadable: {exc})"]
        report.sections.append((f"{name} log (last {LOG_TAIL_LINES} lines)", "\n".join(lines)))


@pytest.fixture
def zookeeper(tmp_path):
    from services.cluster.infrastructure import ZOOKEEPER_HOME

    if not (ZOOKEEPER_HOME / "bin" / "zkServer.sh").exists():
        missing("ZooKeeper (Debian package zookeeper)")
    server = ZooKeeperServer(tmp_path)
    yield server
    server.stop()


# --- a module's cluster -------------------------------------------------------------------
# A test module that starts a cluster defines its own module-scoped `cluster` fixture (each wants
# other sizes and settings); these two then work against it.


@pytest.fixture(scope="module")
def rest(cluster):
    from tests.clusters import Rest

    return Rest(cluster.dispatcher_url)


@pytest.fixture(scope="module")
def jar(rest, tmp_path_factory):
    """A no-op pipeline uploaded to the module's cluster."""
    return rest.upload_noop_pipeline(tmp_path_factory.mktemp("jar"))


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    """A Kafka broker shared by a module's tests (each test makes topics of its own)."""
    from shared.jars import DEFAULT_CACHE_DIR, JarCache, MissingJars

    try:
        JarCache(DEFAULT_CACHE_DIR).jars("kafka-broker")
    except MissingJars as exc:
        missing(f"the Kafka broker's jars ({exc})")
    server = KafkaServer(tmp_path_factory.mktemp("kafka")).start()
    yield server
    server.broker.stop()
