"""Issue 43.5 (first half), played by a hostile pipeline on a real cluster (`headrace up`'s
redis-server with its ACL file, a real Spark driver): through the Redis URL its task is given, a
pipeline set another job's sink fence to 2^62 and read every job's sink bookkeeping. Now each
running lineage has a Redis user of its own (shared/pipeline_redis.py) that reaches its own
`headrace:sink:<lineage>:*` and the data keys, and the shared `pipeline` user reaches the data
keys only. A job that declares its Redis keys (shared/redis_key_grants.py) is confined to them: it
can neither read nor trim nor delete another job's streams."""

from __future__ import annotations

import json
import textwrap

import pytest
import redis
import yaml

from services.jobmanager.pipeline_redis_users import PipelineRedisUsers
from services.taskmanager.runtime.connectors.ownership import SinkOwner
from services.taskmanager.runtime.connectors.redis_replies import StreamReadRefused, count_after, entries
from services.taskmanager.runtime.connectors.redis_sink_fence import (
    SinkBookkeepingRefused,
    commit_entries,
    fence_key,
    prepare_sink,
)
from shared import pipeline_redis
from shared.message_auth import load_secret
from shared.redis_key_grants import READ_OPTION, WRITE_OPTION, KeyGrants
from tests.clusters import start_cluster
from tests.waiting import wait_for

NOPERM = redis.exceptions.NoPermissionError
VICTIM = "f" * 32  # another job's lineage, with a sink of its own
# What the hostile pipelines below share: each try's result, "ok" or "NOPERM" (refused to the
# task's Redis user).
ATTEMPTS = textwrap.dedent("""
    import json
    import redis

    def outcomes(tries):
        found = {}
        for name, attempt in tries.items():
            try:
                attempt()
                found[name] = "ok"
            except redis.exceptions.NoPermissionError:
                found[name] = "NOPERM"
        return found
""")

HOSTILE = ATTEMPTS + textwrap.dedent("""
    def build(ctx):
        victim = ctx.args[0]
        df = ctx.sources.datagen(seed=1, total=20, rows_per_second=50)
        sink = ctx.sinks.redis_stream(df, "hostile-out")  # its lineage's user may now write it
        r = redis.Redis.from_url(ctx.redis_url)
        tries = {
            "set_fence": lambda: r.set(f"headrace:sink:{victim}:out:attempt", 2 ** 62),
            "own_the_sink": lambda: r.hset(f"headrace:sink:{victim}:out:owner", "lineage", ctx.job_id),
            "read_bookkeeping": lambda: r.get(f"headrace:sink:{victim}:out:last_batch"),
            "control_plane": lambda: r.get("hr:jm:epoch"),
            "read_data": lambda: r.xlen("out"),
            "trim_data": lambda: r.xtrim("out", maxlen=0),
        }
        outcome = outcomes(tries)
        r.xadd("hostile-out", {"json": json.dumps(outcome), "user": r.acl_whoami()})
        return sink
""")


DECLARING = ATTEMPTS + textwrap.dedent("""
    def build(ctx):
        r = redis.Redis.from_url(ctx.redis_url)
        tries = {
            "read_victim": lambda: r.xlen("victim-stream"),
            "trim_victim": lambda: r.xtrim("victim-stream", maxlen=0),
            "maxlen0_victim": lambda: r.xadd("victim-stream", {"x": 1}, maxlen=0),
            "delete_victim": lambda: r.delete("victim-stream"),
            "read_source": lambda: r.xlen("declared-src"),
            "trim_source": lambda: r.xtrim("declared-src", maxlen=0),
        }
        outcome = outcomes(tries)
        r.xadd("declared-results", {"json": json.dumps(outcome)})
        df = ctx.sources.datagen(seed=1, total=20, rows_per_second=50)
        return ctx.sinks.redis_stream(df, ctx.args[0])
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("lineage-home"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def admin(cluster):
    c = redis.Redis.from_url(cluster.redis_url)
    yield c
    c.close()


def lineage_users(cluster) -> PipelineRedisUsers:
    settings = yaml.safe_load((cluster.run_dir / "jobmanager.yaml").read_text())
    jm = redis.Redis.from_url(service_url(cluster, "jobmanager"))
    users = PipelineRedisUsers.for_cluster(
        jm, load_secret(cluster.settings, create=False), settings["redis_url"], settings["pipeline_redis_url"]
    )
    assert users is not None  # the JobManager's own user may make them
    return users


def service_url(cluster, name: str) -> str:
    return yaml.safe_load((cluster.run_dir / f"{name}.yaml").read_text())["redis_url"]


def victim_sink(admin) -> None:
    """What the victim lineage's Redis sink keeps: its fence, last batch and owner."""
    admin.set(fence_key(f"{VICTIM}:out"), 7)
    admin.set(f"headrace:sink:{VICTIM}:out:last_batch", 3)
    admin.hset(f"headrace:sink:{VICTIM}:out:owner", mapping={"lineage": VICTIM, "job_id": VICTIM})


def test_a_lineages_user_reaches_its_own_sink_bookkeeping_and_the_data_only(cluster, admin):
    victim_sink(admin)
    settings = yaml.safe_load((cluster.run_dir / "jobmanager.yaml").read_text())
    jm = redis.Redis.from_url(service_url(cluster, "jobmanager"))
    users = PipelineRedisUsers.for_cluster(
        jm, load_secret(cluster.settings, create=False), settings["redis_url"], settings["pipeline_redis_url"]
    )
    assert users is not None  # the JobManager's own user may make them
    mine = "a" * 32
    url = users.url_for(mine)
    assert url and f"{pipeline_redis.lineage_user(mine)}:" in url
    hostile = redis.Redis.from_url(url)
    assert hostile.acl_whoami() == pipeline_redis.lineage_user(mine)
    for forbidden in (
        lambda: hostile.set(fence_key(f"{VICTIM}:out"), 2**62),
        lambda: hostile.hset(f"headrace:sink:{VICTIM}:out:owner", "lineage", mine),
        lambda: hostile.delete(f"headrace:sink:{VICTIM}:out:last_batch"),
        lambda: hostile.get(f"headrace:sink:{VICTIM}:out:last_batch"),
        lambda: hostile.get("hr:jm:epoch"),
        lambda: hostile.lpush("tm.tm-1", b"x"),
    ):
        with pytest.raises(NOPERM):
            forbidden()
    # The real sink, as the hostile lineage: the victim's sink id is refused with the reason...
    with pytest.raises(SinkBookkeepingRefused, match="own lineage"):
        prepare_sink(
            hostile,
            "out",
            sink_id=f"{VICTIM}:out",
            attempt=2**62,
            restored_batch_id=-1,
            owner=SinkOwner(lineage=mine, job_id=mine),
        )
    with pytest.raises(SinkBookkeepingRefused):
        commit_entries(hostile, "out", [b"x"], sink_id=f"{VICTIM}:out", batch_id=99, attempt=2**62)
    # ... and its own sink works, writing the shared data stream.
    prepare_sink(
        hostile,
        "out",
        sink_id=f"{mine}:out",
        attempt=1,
        restored_batch_id=-1,
        owner=SinkOwner(lineage=mine, job_id=mine),
    )
    assert commit_entries(hostile, "out", [b"x"], sink_id=f"{mine}:out", batch_id=0, attempt=1)
    assert hostile.xlen("out") >= 1
    assert admin.get(fence_key(f"{VICTIM}:out")) == b"7"

    # The shared user (the dispatcher's planner, or a task whose lineage has no user) has data only.
    shared = redis.Redis.from_url(settings["pipeline_redis_url"])
    assert shared.acl_whoami() == "pipeline" and shared.xlen("out") >= 1
    for forbidden in (
        lambda: shared.set(fence_key(f"{VICTIM}:out"), 2**62),
        lambda: shared.get(f"headrace:sink:{mine}:out:last_batch"),
    ):
        with pytest.raises(NOPERM):
            forbidden()

    # A lineage with no live job loses its user, and its connections with it.
    assert users.sweep(live={"b" * 32}) >= 1
    assert admin.acl_getuser(pipeline_redis.lineage_user(mine)) is None
    with pytest.raises(redis.exceptions.ConnectionError):
        hostile.ping()


def test_a_hostile_pipeline_reaches_no_other_lineages_sink(cluster, admin, rest, tmp_path):
    victim_sink(admin)
    admin.delete("hostile-out")
    admin.xadd("out", {"n": 1})
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE)
    job = rest.run(rest.upload(path), parallelism=1, programArgsList=[VICTIM], restartStrategy={"type": "none"})
    final = rest.wait_state(job, ["FINISHED", "FAILED"], timeout_s=420)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    [fields] = [f for _, f in admin.xrange("hostile-out") if b"json" in f]
    outcome = json.loads(fields[b"json"])
    assert fields[b"user"].decode() == pipeline_redis.lineage_user(job)  # its lineage's own user
    assert outcome == {
        "set_fence": "NOPERM",
        "own_the_sink": "NOPERM",
        "read_bookkeeping": "NOPERM",
        "control_plane": "NOPERM",
        # A job that declares no keys reaches the streams its connectors use, not another's.
        "read_data": "NOPERM",
        "trim_data": "NOPERM",
    }, outcome
    assert admin.get(fence_key(f"{VICTIM}:out")) == b"7"
    assert admin.hget(f"headrace:sink:{VICTIM}:out:owner", "lineage") == VICTIM.encode()
    # Its own sink wrote, bookkeeping under its lineage.
    wait_for("its sink's entries", lambda: admin.xlen("hostile-out") > 0, timeout_s=10)
    assert admin.get(f"headrace:sink:{job}:hostile-out:last_batch") is not None


def test_a_lineage_that_declares_its_keys_reaches_only_those(cluster, admin):
    users, mine = lineage_users(cluster), "c" * 32
    admin.xadd("granted-src", {"json": "{}"})
    admin.xadd("granted-victim", {"json": "{}"})
    url = users.url_for(mine, KeyGrants(read=("granted-src",), write=("granted-out", "granted-out:*")))
    assert url is not None
    hostile = redis.Redis.from_url(url)
    # What it reads it reads, the server-side count (EVAL_RO) included, and cannot change.
    assert hostile.xlen("granted-src") == 1 and count_after(hostile, "granted-src", "0-0", 10) == 1
    for forbidden in (
        lambda: hostile.xadd("granted-src", {"x": 1}),
        lambda: hostile.xtrim("granted-src", maxlen=0),
        lambda: hostile.delete("granted-src"),
        lambda: hostile.xlen("granted-victim"),
        lambda: hostile.xtrim("granted-victim", maxlen=0),
        lambda: hostile.xadd("granted-victim", {"x": 1}, maxlen=0),
        lambda: hostile.delete("granted-victim"),
        lambda: hostile.set("granted-outx", 1),
    ):
        with pytest.raises(NOPERM):
            forbidden()
    assert admin.xlen("granted-src") == 1 and admin.xlen("granted-victim") == 1
    # The connectors say what to declare.
    with pytest.raises(StreamReadRefused, match=READ_OPTION):
        entries(hostile, "granted-victim", "-", "+")
    owner = SinkOwner(lineage=mine, job_id=mine)
    with pytest.raises(SinkBookkeepingRefused, match=WRITE_OPTION):
        prepare_sink(
            hostile, "granted-victim", sink_id=f"{mine}:granted-victim", attempt=1, restored_batch_id=-1, owner=owner
        )
    prepare_sink(
        hostile, "granted-out:1", sink_id=f"{mine}:granted-out:1", attempt=1, restored_batch_id=-1, owner=owner
    )
    assert commit_entries(hostile, "granted-out:1", [b"x"], sink_id=f"{mine}:granted-out:1", batch_id=0, attempt=1)
    # A later deploy without a declaration gives the user every data key again.
    assert users.url_for(mine) == url and hostile.xlen("granted-victim") == 1
    users.sweep(live=set())
    hostile.close()


def test_a_job_that_declares_its_keys_cannot_touch_another_jobs_stream(cluster, admin, rest, tmp_path):
    admin.delete("victim-stream", "declared-results")
    for n in range(3):
        admin.xadd("victim-stream", {"n": n})
    admin.xadd("declared-src", {"n": 0})
    path = tmp_path / "declaring.py"
    path.write_text(DECLARING)
    jar = rest.upload(path)
    config = {READ_OPTION: ["declared-src"], WRITE_OPTION: ["declared-out", "declared-results"]}
    job = rest.run(
        jar,
        parallelism=1,
        programArgsList=["declared-out"],
        restartStrategy={"type": "none"},
        flinkConfiguration=config,
    )
    final = rest.wait_state(job, ["FINISHED", "FAILED"], timeout_s=420)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    [(_, fields)] = admin.xrange("declared-results")
    assert json.loads(fields[b"json"]) == {
        "read_victim": "NOPERM",
        "trim_victim": "NOPERM",
        "maxlen0_victim": "NOPERM",
        "delete_victim": "NOPERM",
        "read_source": "ok",
        "trim_source": "NOPERM",
    }
    assert admin.xlen("victim-stream") == 3 and admin.xlen("declared-src") == 1
    wait_for("its sink's entries", lambda: admin.xlen("declared-out") > 0, timeout_s=10)

    # A sink writing a stream its job did not declare fails, saying what to declare.
    job = rest.run(
        jar,
        parallelism=1,
        programArgsList=["undeclared-out"],
        restartStrategy={"type": "none"},
        flinkConfiguration=config,
    )
    final = rest.wait_state(job, ["FINISHED", "FAILED"], timeout_s=420)
    root = rest.get(f"/jobs/{job}/exceptions")["root-exception"] or ""
    assert final["state"] == "FAILED" and WRITE_OPTION in root and "undeclared-out" in root, root
    assert not admin.exists("undeclared-out")

    # Patterns that would reach Headrace's own keys are refused at submission.
    r = rest.http.post(f"/jars/{jar}/run", json={"flinkConfiguration": {WRITE_OPTION: ["h*"]}})
    assert r.status_code == 400 and "'hr:'" in r.text, r.text


def test_a_declared_write_key_is_one_lineages_at_a_time(rest, tmp_path):
    # Declaring a key is asking for it: a second lineage asking to write what a live job writes
    # would get the first one's stream to trim or delete, so it is refused naming that job.
    path = tmp_path / "writer.py"
    path.write_text(WRITER)
    jar = rest.upload(path)
    first = rest.run(jar, parallelism=1, flinkConfiguration={WRITE_OPTION: ["owned-out"]})
    try:
        r = rest.http.post(f"/jars/{jar}/run", json={"flinkConfiguration": {WRITE_OPTION: ["owned-*"]}})
        assert r.status_code == 409, r.text
        body = r.json()
        assert first in json.dumps(body) and "owned-*" in json.dumps(body), body
        # Reading it, or writing other keys, is no clash.
        reader = rest.run(
            jar, parallelism=1, flinkConfiguration={READ_OPTION: ["owned-out"], WRITE_OPTION: ["other-out"]}
        )
        rest.cancel(reader)
    finally:
        rest.cancel(first)
    rest.wait_state(first, ["CANCELED"], timeout_s=120)
    second = rest.run(jar, parallelism=1, flinkConfiguration={WRITE_OPTION: ["owned-*"]})
    rest.cancel(second)


WRITER = textwrap.dedent("""
    def build(ctx):
        return ctx.sinks.redis_stream(ctx.sources.datagen(seed=1, rows_per_second=5), "owned-out")
""")


CLAIMING = ATTEMPTS + textwrap.dedent("""
    def build(ctx):
        out, source = ctx.args
        ctx.sources.redis_stream(source, schema="n INT")  # a read claimed (the query reads datagen)
        sink = ctx.sinks.redis_stream(ctx.sources.datagen(seed=1, rows_per_second=5), out)  # a write claimed
        r = redis.Redis.from_url(ctx.redis_url)
        tries = {
            "read_source": lambda: r.xlen(source),
            "trim_source": lambda: r.xtrim(source, maxlen=0),
            "read_victim": lambda: r.xlen("victim-stream"),
            "delete_victim": lambda: r.delete("victim-stream"),
            "trim_own": lambda: r.xtrim(out, minid="0"),
        }
        outcome = outcomes(tries)
        r.xadd(out, {"json": json.dumps(outcome)})
        return sink
""")


def test_a_job_without_declared_keys_reaches_the_streams_its_connectors_use_one_writer_each(
    cluster, admin, rest, tmp_path
):
    """pipeline_redis_keys: connectors (the default): its Redis source's stream to read, its Redis
    sink's to write, claimed as the pipeline builds them; a second lineage's sink on the same
    stream fails for good, naming the first; another's streams stay out of reach."""
    admin.delete("claimed-out", "victim-stream")
    admin.xadd("claimed-src", {"n": 1})
    for n in range(3):
        admin.xadd("victim-stream", {"n": n})
    path = tmp_path / "claiming.py"
    path.write_text(CLAIMING)
    jar = rest.upload(path)
    first = rest.run(jar, parallelism=1, programArgsList=["claimed-out", "claimed-src"])
    try:
        entry = wait_for(
            "the first job's outcome in its sink's stream",
            lambda: next((f for _, f in admin.xrange("claimed-out") if b"json" in f), None),
            timeout_s=420,
        )
        assert json.loads(entry[b"json"]) == {
            "read_source": "ok",
            "trim_source": "NOPERM",
            "read_victim": "NOPERM",
            "delete_victim": "NOPERM",
            "trim_own": "ok",
        }
        assert admin.xlen("victim-stream") == 3 and admin.xlen("claimed-src") == 1
        user = admin.acl_getuser(pipeline_redis.lineage_user(first))
        assert {"~claimed-out", "%R~claimed-src"} <= set(user["keys"]), user["keys"]

        second = rest.run(
            jar, parallelism=1, programArgsList=["claimed-out", "claimed-src"], restartStrategy={"type": "fixed-delay"}
        )
        final = rest.wait_state(second, ["FAILED"], timeout_s=420)
        exceptions = rest.get(f"/jobs/{second}/exceptions")
        root = exceptions["root-exception"] or ""
        assert final["restarts"] == 0, final  # no restart could help
        assert [e["exceptionName"] for e in exceptions["exceptionHistory"]["entries"]] == ["RedisKeyRefused"]
        assert first in root and "'claimed-out'" in root, root
        # A job declaring the stream is refused the same way before it is deployed (the dispatcher
        # sees declarations only, the JobManager the claims too).
        declaring = rest.run(
            jar,
            parallelism=1,
            programArgsList=["claimed-out", "claimed-src"],
            flinkConfiguration={WRITE_OPTION: ["claimed-*"], READ_OPTION: ["claimed-src"]},
        )
        rest.wait_state(declaring, ["FAILED"], timeout_s=120)
        exceptions = rest.get(f"/jobs/{declaring}/exceptions")
        assert [e["exceptionName"] for e in exceptions["exceptionHistory"]["entries"]] == ["RedisKeyRefused"]
        assert first in exceptions["root-exception"] and "'claimed-*'" in exceptions["root-exception"]
        assert rest.job(first)["state"] == "RUNNING"
    finally:
        rest.cancel(first)
