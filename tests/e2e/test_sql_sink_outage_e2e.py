"""A counting job whose sink database goes away for 30 s costs no task restart.

A cluster (catalog on the machine's PostgreSQL) runs examples/keyed_counts.py: an outside
producer writes numbered events into a Redis stream, and the job upserts each key's running
count and sum into a table of a private PostgreSQL (tests/private_postgres.py). Once the job has
committed output, that server is stopped for 30 s and started again. The sink waits for it
(connectors/sql_retry.py, bound 60 s by default) and the job's `waiting-reason` says so
meanwhile; the job's task keeps its first attempt, and
in the end the table holds exactly the count and sum of every key: nothing lost, nothing twice.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.clusters import Rest, start_cluster
from tests.e2e.counting import TRIGGER, Producer, expected_totals, sql_totals
from tests.private_postgres import PrivatePostgres
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
OUTAGE_S = 30.0
WAITING_LINE = "unreachable while"  # the sink's WARNING in the driver log


@pytest.fixture(scope="module")
def sink_pg():
    with PrivatePostgres() as server:
        yield server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("sink-outage-home"),
        catalog_url=pg_url_module,
        taskmanagers=1,
        slots=1,
        warm_drivers=1,
        restart_strategy={"type": "fixed-delay", "attempts": 10, "delay": "1 s"},
    )
    yield c
    c.stop()


def driver_log_text(c) -> str:
    return "\n".join(
        p.read_text(errors="replace") for p in Path(c.settings.home).glob("work/taskmanagers/*/logs/driver-*.log")
    )


def test_a_30_s_outage_of_the_sink_database_costs_no_restart_and_counts_exactly(cluster, sink_pg, redis_server):
    rest = Rest(cluster.dispatcher_url)
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    producer = Producer(redis_server.url, "events", rate=100.0).start()
    args = [
        "--stream",
        "events",
        "--source-url",
        redis_server.url,
        "--sink",
        "sql",
        "--table",
        "outage_counts",
        "--sink-url",
        sink_pg.url,
        "--trigger",
        TRIGGER,
    ]
    job = rest.run(
        jar,
        parallelism=1,
        jobName="sink-outage",
        programArgsList=args,
        # A loaded machine (the suite's other tests) may take minutes to start a driver.
        flinkConfiguration={"execution.checkpointing.interval": "2 s", "headrace.task.startup-timeout": "5 min"},
    )
    try:
        rest.wait_attempt_running(job, 0, timeout_s=320)
        wait_for("the job's first committed batch", lambda: sql_totals(sink_pg.url, "outage_counts"), 120, poll_s=0.25)

        sink_pg.stop()
        stopped = time.monotonic()
        # The outage must meet a batch: on a loaded machine the next one may take a while to come.
        wait_for(
            "the sink to say it waits for its database",
            lambda: WAITING_LINE in driver_log_text(cluster),
            90,
            poll_s=0.25,
        )
        noticed = time.monotonic()
        # The task's status says so: the attempt's (and the job's) waiting-reason.
        reason = wait_for("the job's waiting-reason", lambda: rest.job(job).get("waiting-reason"), 20, poll_s=0.25)
        assert "waiting for database" in reason and str(sink_pg.port) in reason, reason
        time.sleep(max(0.0, OUTAGE_S - (noticed - stopped), 15.0 - (time.monotonic() - noticed)))
        assert rest.job(job)["state"] == "RUNNING"
        sink_pg.start()

        time.sleep(3)  # a few batches after the outage, then the producer stops
        produced = producer.stop()
        expected = expected_totals(produced)
        wait_for(
            f"the sink to hold exactly the {produced} events",
            lambda: sql_totals(sink_pg.url, "outage_counts") == expected,
            120,
            poll_s=0.25,
        )
        attempts = rest.attempts(job)
        assert [a["attempt"] for a in attempts] == [0], f"the outage cost a restart: {attempts}"
        assert attempts[0]["status"] == "RUNNING"
        assert rest.job(job)["state"] == "RUNNING"
        assert "answers again after" in driver_log_text(cluster)
        assert rest.job(job).get("waiting-reason") is None
    finally:
        producer.stop()
        sink_pg.start()
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
