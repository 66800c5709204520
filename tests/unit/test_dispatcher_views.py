"""The dispatcher's pure parts: catalog rows -> Flink JSON shapes (`views/shapes.py`) and pydantic errors ->
the shared error shape (`errors.describe`). Rows are plain namespaces; no database, no HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as Row

import pytest
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from services.dispatcher.errors import ApiError, Problem, error_body, flink_error_body, problems_from_validation
from services.dispatcher.schemas import JarRunRequest, normalise_restart_strategy, parse_duration
from services.dispatcher.views import shapes
from shared.states import EXECUTION_STATE_NAMES, JOB_STATE_NAMES

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    return T0_MS + int(seconds * 1000)


def job(**kw) -> Row:
    base = dict(
        id="a" * 32,
        name="clicks",
        status="RUNNING",
        created_at=at(0),
        updated_at=at(5),
        end_at=None,
        waiting_reason=None,
        config={},
        restart_strategy={"type": "none"},
        parallelism=2,
        entry="build",
        kind="pyspark",
        program_args=[],
        artifact_id="x_job.py",
    )
    base.update(kw)
    return Row(**base)


def vertex(id="v" * 32, **kw) -> Row:
    return Row(**{"id": id, "name": "Source: redis -> Sink: pg", "parallelism": 2, "idx": 0, **kw})


def execution(attempt=0, state="RUNNING", **kw) -> Row:
    base = dict(
        id=f"e{attempt}".ljust(32, "0"),
        vertex_id="v" * 32,
        attempt=attempt,
        state=state,
        taskmanager_id="tm-1",
        slots=[0, 1],
        start_at=at(2),
        end_at=None,
        failure_cause=None,
        waiting_reason=None,
        rows_processed=10,
        last_batch_id=7,
        restored_from=None,
        restored_checkpoint_id=None,
        timestamps={"CREATED": ms(1), "SCHEDULED": ms(1.5), "DEPLOYING": ms(2), "RUNNING": ms(3)},
    )
    base.update(kw)
    return Row(**base)


def tm(**kw) -> Row:
    base = dict(
        id="tm-1",
        host="worker-1",
        queue="tm.tm-1",
        state="REGISTERED",
        slots_total=4,
        slots_free=1,
        cores=8.0,
        memory_bytes=16 * 2**30,
        allocations=[],
        registered_at=at(0),
        last_heartbeat=at(9),
        lost_reason=None,
        last_lost_at=None,
        last_lost_reason=None,
    )
    base.update(kw)
    return Row(**base)


# --- jobs ----------------------------------------------------------------------------------


def test_job_overview_running():
    v = vertex()
    out = shapes.job_overview(job(), [v], {v.id: execution()}, now_ms=ms(10))
    assert out["jid"] == "a" * 32 and out["state"] == "RUNNING"
    assert (out["start-time"], out["end-time"], out["duration"], out["last-modification"]) == (T0_MS, -1, 10_000, ms(5))
    assert out["tasks"]["total"] == 1 and out["tasks"]["running"] == 1
    assert sum(v for k, v in out["tasks"].items() if k != "total") == 1
    assert all(k == k.lower() for k in out["tasks"])
    # Flink 2.x's REST client refuses a JobDetails without these (`flink list` failed on it).
    assert (out["jobType"], out["schedulerType"], out["pending-operators"]) == ("STREAMING", "Default", 0)


def test_job_overview_finished_uses_end_time_and_unscheduled_vertices_count_as_created():
    v1, v2 = vertex("1" * 32), vertex("2" * 32, idx=1)
    out = shapes.job_overview(
        job(status="FINISHED", end_at=at(4)), [v1, v2], {v1.id: execution(state="FINISHED")}, now_ms=ms(100)
    )
    assert out["end-time"] == ms(4) and out["duration"] == 4000
    assert out["tasks"] == {**{s.lower(): 0 for s in EXECUTION_STATE_NAMES}, "total": 2, "finished": 1, "created": 1}


def test_job_details_timestamps_vertices_and_extras():
    v = vertex()
    ex = execution(attempt=2, waiting_reason=None)
    out = shapes.job_details(
        job(config={"spark.sql.shuffle.partitions": "8"}),
        [v],
        {v.id: ex},
        {"INITIALIZING": T0_MS, "CREATED": ms(1), "RUNNING": ms(2)},
        max_par=8,
        now_ms=ms(10),
    )
    assert set(out["timestamps"]) == set(JOB_STATE_NAMES)  # Flink's SUSPENDED and RECONCILING too
    assert out["timestamps"]["RUNNING"] == ms(2) and out["timestamps"]["FAILED"] == 0
    assert out["now"] == ms(10) and out["maxParallelism"] == 8 and out["isStoppable"] is False
    [vi] = out["vertices"]
    assert vi == {
        "id": v.id,
        "name": v.name,
        "maxParallelism": 8,
        "parallelism": 2,
        "status": "RUNNING",
        "start-time": ms(2),
        "end-time": -1,
        "duration": 8000,
        "tasks": {**dict.fromkeys(EXECUTION_STATE_NAMES, 0), "RUNNING": 1},
        "metrics": {"read-records": 10, "read-records-complete": False},
    }
    assert out["status-counts"]["RUNNING"] == 1
    assert out["plan"] == {
        "jid": "a" * 32,
        "name": "clicks",
        "type": "STREAMING",
        "nodes": [
            {
                "id": v.id,
                "parallelism": 2,
                "operator": "",
                "operator_strategy": "",
                "description": v.name,
                "optimizer_properties": {},
            }
        ],
    }
    assert out["attempts"] == 3 and out["restart-strategy"] == {"type": "none"} and out["waiting-reason"] is None
    assert out["restarts"] == 2 and out["deployment"] is None and out["last-failure"] is None


TRACE = (
    'Traceback (most recent call last):\n  File "/job/clicks.py", line 9, in parse\n    return int(raw)\n'
    "ValueError: invalid literal for int() with base 10: 'x'\n"
)


def test_a_failure_is_summarised_by_its_exception_not_the_traces_first_line():
    cause = f"ValueError: {TRACE}"
    v = vertex()
    [attempt] = shapes.vertex_details(
        v, [execution(state="FAILED", failure_cause=cause)], {}, max_par=4, now_ms=ms(10)
    )["attempts"]
    assert attempt["failure-cause"] == cause  # whole, as the exceptions tab shows it
    assert attempt["failure-summary"] == "ValueError: invalid literal for int() with base 10: 'x'"
    row = exc_row(1)
    row.exception_name, row.stacktrace = "ValueError", TRACE
    [entry] = shapes.exceptions([row], {}, limit=4)["exceptionHistory"]["entries"]
    assert entry["summary"] == attempt["failure-summary"] and entry["stacktrace"] == TRACE
    out = shapes.job_details(
        job(status="RESTARTING"), [v], {v.id: execution(attempt=1)}, {}, max_par=4, now_ms=ms(10), last_exception=row
    )
    assert out["last-failure"] == {"summary": attempt["failure-summary"], "timestamp": ms(1), "attempt": 1}


def test_the_job_list_names_its_restarts_and_its_deployment():
    v = vertex()
    out = shapes.job_overview(job(deployment="clicks"), [v], {v.id: execution(attempt=3)}, now_ms=ms(10))
    assert (out["restarts"], out["deployment"]) == (3, "clicks")
    assert shapes.job_overview(job(), [v], {}, now_ms=ms(10))["restarts"] == 0


def test_job_details_before_planning():
    out = shapes.job_details(job(status="INITIALIZING"), [], {}, {"INITIALIZING": T0_MS}, max_par=4, now_ms=ms(1))
    assert out["vertices"] == [] and out["attempts"] == 0 and out["plan"]["nodes"] == []
    assert sum(out["status-counts"].values()) == 0


def test_waiting_reason_prefers_the_job_then_a_live_attempt():
    v = vertex()
    waiting = execution(state="SCHEDULED", waiting_reason="no free slots")
    assert shapes.waiting_reason(job(waiting_reason="no leader"), {v.id: waiting}) == "no leader"
    assert shapes.waiting_reason(job(), {v.id: waiting}) == "no free slots"
    assert shapes.waiting_reason(job(), {v.id: execution(state="FAILED", waiting_reason="stale")}) is None


@pytest.mark.parametrize(
    "config,default,expected",
    [
        ({}, 4, 4),
        ({"spark.sql.shuffle.partitions": 16}, 4, 16),
        ({"spark.sql.shuffle.partitions": "bad"}, 4, 4),
        ({"maxParallelism": 0}, 4, 4),
        (None, 2, 2),
    ],
)
def test_max_parallelism(config, default, expected):
    assert shapes.max_parallelism(config, default) == expected


def test_job_type_follows_the_runtime_mode():
    assert shapes.job_type({}) == "STREAMING"
    assert shapes.job_type({"execution.runtime-mode": "batch"}) == "BATCH"


# --- vertices ------------------------------------------------------------------------------


def test_status_duration_of_a_running_attempt():
    ex = execution()
    assert shapes.status_duration(ex.timestamps, "RUNNING", ms(10)) == {
        "CREATED": 500,
        "SCHEDULED": 500,
        "DEPLOYING": 1000,
        "INITIALIZING": 0,
        "RUNNING": 7000,
    }


def test_status_duration_stops_at_a_terminal_state():
    stamps = {"CREATED": ms(0), "SCHEDULED": ms(1), "DEPLOYING": ms(2), "RUNNING": ms(3), "FAILED": ms(7)}
    assert shapes.status_duration(stamps, "FAILED", ms(100))["RUNNING"] == 4000


def test_vertex_details_current_attempt_and_history():
    v = vertex()
    old = execution(
        attempt=0,
        state="FAILED",
        end_at=at(4),
        failure_cause="boom",
        taskmanager_id="tm-1",
        restored_from="/sp/savepoint-aaaaaa-0123456789ab",
        restored_checkpoint_id=4,
    )
    cur = execution(
        attempt=1,
        state="SCHEDULED",
        start_at=None,
        taskmanager_id=None,
        slots=[],
        waiting_reason="waiting for slots",
        timestamps={"CREATED": ms(5), "SCHEDULED": ms(5)},
    )
    out = shapes.vertex_details(v, [cur, old], {"tm-1": "worker-1"}, max_par=4, now_ms=ms(10))
    [st] = out["subtasks"]
    assert st["attempt"] == 1 and st["status"] == "SCHEDULED" and st["endpoint"] == "(unassigned)"
    assert st["start-time"] == -1 and st["duration"] == -1
    assert [a["attempt"] for a in out["attempts"]] == [0, 1]
    assert out["attempts"][0] == {
        "attempt": 0,
        "execution-id": old.id,
        "status": "FAILED",
        "taskmanager-id": "tm-1",
        "slots": [0, 1],
        "start-time": ms(2),
        "end-time": ms(4),
        "duration": 2000,
        "timestamps": old.timestamps,
        "failure-cause": "boom",
        "failure-summary": "boom",
        "waiting-reason": None,
        "last-batch-id": 7,
        "read-records": 10,
        "restored-from": "/sp/savepoint-aaaaaa-0123456789ab",
        "restored-checkpoint-id": 4,
    }
    assert out["attempts"][1]["waiting-reason"] == "waiting for slots"
    assert (out["attempts"][1]["restored-from"], out["attempts"][1]["restored-checkpoint-id"]) == (None, None)
    assert shapes.vertex_details(v, [], {}, max_par=4, now_ms=0)["subtasks"] == []


def test_vertex_details_keeps_only_the_newest_attempts():
    out = shapes.vertex_details(
        vertex(), [execution(attempt=i, state="FAILED") for i in range(20)], {}, max_par=4, now_ms=ms(10), history=16
    )
    assert [a["attempt"] for a in out["attempts"]] == list(range(4, 20))


# --- exceptions ----------------------------------------------------------------------------


def exc_row(i: int, tm_id="tm-1") -> Row:
    return Row(
        exception_name=f"E{i}", stacktrace=f"trace {i}", at=at(i), vertex_name="src", attempt=i, taskmanager_id=tm_id
    )


def test_exceptions_newest_first_and_truncated():
    rows = [exc_row(3), exc_row(2, None), exc_row(1)]
    out = shapes.exceptions(rows, {"tm-1": "worker-1"}, limit=2)
    assert out["root-exception"] == "trace 3" and out["timestamp"] == ms(3)
    assert out["all-exceptions"] == [] and out["truncated"] is False
    entries = out["exceptionHistory"]["entries"]
    assert out["exceptionHistory"]["truncated"] is True and len(entries) == 2
    assert entries[0] == {
        "exceptionName": "E3",
        "stacktrace": "trace 3",
        "summary": "E3: trace 3",
        "timestamp": ms(3),
        "taskName": "src",
        "endpoint": "worker-1",
        "taskManagerId": "tm-1",
        "failureLabels": {},
        "concurrentExceptions": [],
        "attempt": 3,
    }
    assert entries[1]["endpoint"] is None and entries[1]["taskManagerId"] is None


def test_no_exceptions():
    out = shapes.exceptions([], {}, limit=16)
    assert out["root-exception"] is None and out["exceptionHistory"] == {"entries": [], "truncated": False}


# --- cluster and TaskManagers --------------------------------------------------------------


def test_cluster_overview_counts_every_live_status_as_running():
    counts = {"RUNNING": 2, "CREATED": 1, "RESTARTING": 1, "INITIALIZING": 1, "FINISHED": 3, "CANCELED": 4, "FAILED": 5}
    out = shapes.cluster_overview([tm(), tm(id="tm-2", slots_total=2, slots_free=2)], counts)
    assert out == {
        "taskmanagers": 2,
        "slots-total": 6,
        "slots-available": 3,
        "jobs-running": 5,
        "jobs-finished": 3,
        "jobs-cancelled": 4,
        "jobs-failed": 5,
        "flink-version": "headrace-0.1.0",
        "flink-commit": "unknown",
    }


def test_taskmanager_info_in_flink_shape():
    out = shapes.taskmanager_info(tm())
    assert out["timeSinceLastHeartbeat"] == ms(9)  # an epoch timestamp, as Flink reports it
    assert (out["slotsNumber"], out["freeSlots"], out["dataPort"], out["jmxPort"]) == (4, 1, -1, -1)
    assert out["totalResource"]["cpuCores"] == 8.0 and out["totalResource"]["taskHeapMemory"] == 16384
    assert out["freeResource"]["cpuCores"] == 2.0 and out["freeResource"]["taskHeapMemory"] == 4096
    assert out["hardware"] == {"cpuCores": 8, "physicalMemory": 16 * 2**30, "freeMemory": 4 * 2**30, "managedMemory": 0}


def test_taskmanager_details_lists_allocated_slots():
    alloc = {"index": 0, "allocation_id": "a" * 32, "job_id": "j" * 32, "execution_id": "e" * 32, "extra": 1}
    out = shapes.taskmanager_details(tm(allocations=[alloc], state="LOST", lost_reason="heartbeat timeout"))
    assert out["allocatedSlots"] == [{**{k: v for k, v in alloc.items() if k != "extra"}, "memory": None}]
    assert out["state"] == "LOST" and out["lost-reason"] == "heartbeat timeout"


def test_each_slot_shows_the_memory_figure_its_taskmanager_reported_for_its_task():
    allocs = [{"index": i, "allocation_id": "a" * 32, "job_id": "j" * 32, "execution_id": "e" * 32} for i in (0, 1)]
    allocs.append({"index": 2, "allocation_id": "b" * 32, "job_id": "k" * 32, "execution_id": "f" * 32})
    memory = {
        "e" * 32: {"job_id": "j" * 32, "used": 1288490188, "limit": 3 * 2**30, "measure": "PSS"},
        "f" * 32: {"job_id": "k" * 32, "used": "garbled", "limit": None, "measure": "PSS"},
        "x" * 32: {"job_id": "j" * 32, "used": 1, "limit": None, "measure": "PSS"},
    }
    out = shapes.taskmanager_details(tm(allocations=allocs), memory=memory)
    assert [s["memory"] for s in out["allocatedSlots"]] == [
        {"used": 1288490188, "limit": 3 * 2**30, "measure": "PSS"}
    ] * 2 + [None]


def test_a_taskmanager_registered_again_still_shows_its_last_loss():
    never = shapes.taskmanager_info(tm())
    assert never["last-lost-at"] is None and never["last-lost-reason"] is None
    back = shapes.taskmanager_details(tm(last_lost_at=at(5), last_lost_reason="TaskManager lost: its process exited"))
    assert back["state"] == "REGISTERED" and back["lost-reason"] is None
    assert back["last-lost-at"] == ms(5) and back["last-lost-reason"] == "TaskManager lost: its process exited"


def test_taskmanager_without_slots():
    out = shapes.taskmanager_info(tm(slots_total=0, slots_free=0))
    assert out["freeResource"]["cpuCores"] == 0


# --- jars and config -----------------------------------------------------------------------


def test_jar_entries_put_the_default_first():
    assert shapes.jar_entries(["helper", "build", "main"]) == [
        {"name": "build", "description": None},
        {"name": "helper", "description": None},
        {"name": "main", "description": None},
    ]
    assert shapes.jar_entries(None) == [{"name": "build", "description": None}]


def test_jar_file():
    art = Row(id="x_job.py", name="job.py", uploaded_at=at(1), sha256="ab" * 32)
    assert shapes.jar_file(art, ["build"]) == {
        "id": "x_job.py",
        "name": "job.py",
        "uploaded": ms(1),
        "entry": [{"name": "build", "description": None}],
        "sha256": "ab" * 32,
    }


def test_dashboard_config():
    out = shapes.dashboard_config(refresh_interval_ms=1000, timezone_name="UTC", timezone_offset_ms=0)
    assert out["refresh-interval"] == 1000 and out["features"]["web-cancel"] is True
    assert out["kafka-bootstrap-servers"] is None
    out = shapes.dashboard_config(
        refresh_interval_ms=1000, timezone_name="UTC", timezone_offset_ms=0, kafka_bootstrap_servers="127.0.0.1:9092"
    )
    assert out["kafka-bootstrap-servers"] == "127.0.0.1:9092"


# --- request validation and the error shape ------------------------------------------------


def validation_problems(body) -> list[Problem]:
    with pytest.raises(ValidationError) as info:
        JarRunRequest.model_validate(body)
    return problems_from_validation(info.value.errors())


def test_error_body_shape():
    body = error_body([Problem("must be an integer >= 1, got 0", field="parallelism", expected="integer >= 1", got=0)])
    assert body == {
        "errors": ["parallelism: must be an integer >= 1, got 0"],
        "field": "parallelism",
        "expected": "integer >= 1",
    }
    two = error_body([Problem("a", field="x"), Problem("b", field="y", hint="h")])
    assert two["errors"] == ["x: a", "y: b"] and [d["field"] for d in two["details"]] == ["x", "y"]
    assert error_body([Problem("Not found: /x")]) == {"errors": ["Not found: /x"]}
    assert str(ApiError.of(404, "job 'x' not found", field="jobid", prefix=False)) == "job 'x' not found"


def test_flink_error_body_has_errors_as_its_only_key():
    # Flink's REST client takes a body for an error only when "errors" is its one key.
    body = flink_error_body(
        [
            Problem("no such job", field="jobid", expected="an id", hint="GET /jobs", prefix=False),
            Problem("b", field="y"),
        ]
    )
    assert body == {"errors": ["no such job (hint: GET /jobs)", "y: b"]}


@pytest.mark.parametrize(
    "body,field,expected",
    [
        ({"parallelism": 0}, "parallelism", "integer >= 1"),
        ({"parallelism": True}, "parallelism", "integer >= 1"),
        ({"restartStrategy": {"type": "fixed-delay", "attempts": "x"}}, "restartStrategy.attempts", "integer >= 0"),
        (
            {"restartStrategy": {"type": "exponential-delay", "initial-backoff": "9 min"}},
            "restartStrategy.max-backoff",
            "max-backoff >= initial-backoff",
        ),
        ({"programArgsList": [1]}, "programArgsList.0", "string"),
    ],
)
def test_validation_errors_name_the_field_and_the_expectation(body, field, expected):
    [p] = validation_problems(body)
    assert p.field == field and p.expected == expected and p.text().startswith(f"{field}: ")


def test_unknown_fields_suggest_the_right_one():
    [p] = validation_problems({"entryclass": "main"})
    assert p.field == "entryclass" and p.got == "main" and "did you mean 'entryClass'?" in p.hint


# A body's number is seconds; a string has a unit (shared/durations.py; tests/unit/test_option_parsing.py).
@pytest.mark.parametrize(
    "value,seconds",
    [(0, 0.0), (2.5, 2.5), ("10 s", 10.0), ("500ms", 0.5), ("2 min", 120.0), ("1 h", 3600.0), ("0", 0.0)],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["-10", -1, True, "ten s", None, "10"])
def test_parse_duration_refuses(value):
    with pytest.raises(PydanticCustomError):
        parse_duration(value)


def test_restart_strategy_defaults_follow_flink():
    assert normalise_restart_strategy({"type": "fixed-delay"}) == {"type": "fixed-delay", "attempts": 1, "delay": 1.0}
    assert normalise_restart_strategy({"type": "off"}) == {"type": "none"}
    assert normalise_restart_strategy({"type": "failure-rate", "delay": "2 s"}) == {
        "type": "failure-rate",
        "max-failures-per-interval": 1,
        "failure-rate-interval": 60.0,
        "delay": 2.0,
    }


def test_a_lost_taskmanager_says_it_is_lost_when_and_why():
    info = shapes.taskmanager_info(
        tm(
            state="LOST",
            lost_reason="no heartbeat for 10 s",
            last_lost_at=at(3),
            last_lost_reason="no heartbeat for 10 s",
        )
    )
    assert (info["state"], info["lost-reason"], info["last-lost-at"]) == ("LOST", "no heartbeat for 10 s", ms(3))
    registered = shapes.taskmanager_info(tm())
    assert (registered["state"], registered["lost-reason"]) == ("REGISTERED", None)
