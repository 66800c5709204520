"""Plan a pipeline without running it, and print the signature of its state as one JSON line.

    python -m services.taskmanager.runtime.planner --artifact PATH [--entry build]
        [--args-json '["--x", "1"]'] [--config-json '{...}' | -] [--parallelism P] [--workdir DIR]
        [--catalog-url URL] [--redis-url URL]

`--config-json -` reads the configuration from stdin; the URLs default to the environment's
HEADRACE_PLANNER_CATALOG_URL / HEADRACE_PLANNER_REDIS_URL (both keep passwords off the command
line, where any user of the host can read them); HEADRACE_PLANNER_LAKE_DIR is the cluster's lake
directory, where a Delta source's relative table path is.

stdout gets exactly one line, and the exit code is 0 whenever that line was written:
    {"ok": true, "plan": <plan_signature>, "seconds": 14.2}
    {"ok": false, "stage": "spark" | "build" | "signature", "error": "...", "traceback": "..."}
`stage` says whose fault a failure is: "build" is the pipeline's (it cannot be imported or its
entry function raised), "spark" and "signature" are ours. Everything else (Spark's logs, the
pipeline's prints) goes to stderr.

The pipeline is loaded exactly as the runner loads it (pipeline_loader.load_pipeline, a PipelineContext,
`spark.sql.*` options of the configuration applied first) in a local[1] session without UI or
warm-up. Building a streaming DataFrame opens no connection (the Redis stream and Kafka sources
connect when the query starts), so the catalog and Redis URLs and the Kafka brokers may be
placeholders: those not given point nowhere (`.invalid`), so a pipeline that does connect while
building fails clearly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from shared.spark_runtime import SparkRuntime

PLACEHOLDER_REDIS_URL = "redis://headrace-planner.invalid:6379/0"
# A planned pipeline reaches no broker (ctx.planning): a Kafka connector without an address of its
# own gets this one, which is never connected to.
PLACEHOLDER_KAFKA_BOOTSTRAP = "headrace-planner.invalid:9092"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.runtime.planner")
    p.add_argument("--artifact", default=None, help="the pipeline's .py or .zip (required unless --await-request)")
    p.add_argument(
        "--await-request",
        action="store_true",
        help='start Spark and plan a pipeline of its own first, print {"ready": true}, then read one request '
        "line from stdin: "
        '{"artifact", "entry", "args", "config", "parallelism"} (a warm planner)',
    )
    p.add_argument("--entry", default="build")
    p.add_argument("--args-json", default="[]", help="the program arguments, a JSON list of strings")
    p.add_argument("--config-json", default="{}", help="the job's configuration, a JSON object; - for stdin")
    p.add_argument("--parallelism", type=int, default=1, help="what ctx.parallelism says (Spark runs local[1])")
    p.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed)")
    SparkRuntime.add_arguments(p)  # the drivers' jars, and their class archive: the planner's JVM starts faster
    p.add_argument("--catalog-url", default=os.environ.get("HEADRACE_PLANNER_CATALOG_URL"))
    p.add_argument("--redis-url", default=os.environ.get("HEADRACE_PLANNER_REDIS_URL"))
    return p.parse_args(argv)


def _failure(stage: str, exc: BaseException) -> dict[str, Any]:
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):  # argparse refusing the program arguments, typically
        error = f"the pipeline exited with code {exc.code} while building (are its program arguments right?)"
    return {"ok": False, "stage": stage, "error": error, "traceback": "".join(traceback.format_exception(exc))[-8000:]}


def plan(args: argparse.Namespace, workdir: Path, spark_box: list) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        program_args = [str(a) for a in json.loads(args.args_json)]
        config = dict(json.loads(sys.stdin.read() if args.config_json == "-" else args.config_json))
    except (ValueError, TypeError) as exc:
        return _failure("build", exc)
    try:
        spark_box.append(_session(args, workdir))
    except Exception as exc:  # noqa: BLE001 - reported on stdout
        return _failure("spark", exc)
    return plan_in(
        spark_box[0],
        args,
        workdir,
        artifact=args.artifact,
        entry=args.entry,
        program_args=program_args,
        config=config,
        parallelism=args.parallelism,
        t0=t0,
    )


def _session(args: argparse.Namespace, workdir: Path):
    from . import class_archive
    from .spark_session import build_spark

    runtime = SparkRuntime.from_args(args)
    return build_spark(
        1,
        workdir,
        shuffle_partitions=2,
        driver_memory="512m",
        app_name="headrace-planner",
        extra_java_options=class_archive.runtime_java_options(runtime),
        jars=runtime.jars,
    )


def plan_in(
    spark,
    args: argparse.Namespace,
    workdir: Path,
    *,
    artifact: str,
    entry: str,
    program_args: list[str],
    config: dict[str, Any],
    parallelism: int,
    t0: float,
) -> dict[str, Any]:
    """Plan the pipeline in a running session (a cold planner's, or a warm one's made before the
    request came)."""
    from shared import job_options

    from .pipeline_loader import load_pipeline

    try:
        shuffle = job_options.explicit_state_partitions(config) or max(2, parallelism)
        # As the runner does: options such as state format versions change the state's shape.
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
        for key, value in config.items():
            if isinstance(key, str) and key.startswith("spark.sql."):
                spark.conf.set(key, str(value))
    except Exception as exc:  # noqa: BLE001 - reported on stdout
        return _failure("spark", exc)
    try:
        module = load_pipeline(artifact, config, spark)
        build = getattr(module, entry, None)
        if not callable(build):
            raise AttributeError(f"pipeline {artifact} has no function {entry}(ctx)")
    except BaseException as exc:  # noqa: BLE001 - the pipeline's failure, reported on stdout
        return _failure("build", exc)
    return plan_build(spark, args, workdir, build, f"{entry}(ctx)", program_args, config, parallelism, t0)


def plan_build(
    spark,
    args: argparse.Namespace,
    workdir: Path,
    build,
    name: str,
    program_args: list[str],
    config: dict[str, Any],
    parallelism: int,
    t0: float,
) -> dict[str, Any]:
    """Call a pipeline's build function with a planning context and sign the plan it returns."""
    try:
        from .connectors import SinkHandle
        from .context import PipelineContext

        ctx = PipelineContext(
            spark,
            job_id="planner",
            job_name="planner",
            args=program_args,
            config=config,
            parallelism=parallelism,
            checkpoint_dir=str(workdir / "checkpoints"),
            catalog_url=args.catalog_url or config.get("catalog_url") or f"sqlite:///{workdir / 'placeholder.db'}",
            redis_url=args.redis_url or config.get("redis_url") or PLACEHOLDER_REDIS_URL,
            kafka_bootstrap_servers=config.get("kafka_bootstrap_servers") or PLACEHOLDER_KAFKA_BOOTSTRAP,
            lake_dir=os.environ.get("HEADRACE_PLANNER_LAKE_DIR", ""),  # where a Delta source's table is
            planning=True,
        )
        handle = build(ctx)
        if not isinstance(handle, SinkHandle):
            raise TypeError(f"{name} must return a sink handle from ctx.sinks.*, got {type(handle).__name__}")
    except BaseException as exc:  # noqa: BLE001 - the pipeline's failure, reported on stdout
        return _failure("build", exc)
    try:
        from .plan_signature import plan_signature

        signature = plan_signature(handle.df, output_mode=handle.output_mode)
    except Exception as exc:  # noqa: BLE001
        return _failure("signature", exc)
    return {"ok": True, "plan": signature, "seconds": round(time.monotonic() - t0, 2)}


def _warm_up_pipeline(ctx):
    """The shape of most pipelines: a Redis stream, a keyed aggregation, the SQL sink by key."""
    from pyspark.sql import functions as F

    events = ctx.sources.redis_stream("headrace-planner-warm-up", schema="key STRING, n BIGINT, value BIGINT")
    totals = events.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("total"))
    return ctx.sinks.sql_table(totals, "warm_up", key_columns=["key"], output_mode="update")


def warm_up_plan(spark, args: argparse.Namespace, workdir: Path) -> None:
    """Plan a pipeline once before a warm planner reports ready. A JVM's first plan loads and
    compiles Catalyst's analysis of a streaming aggregate and the Py4J calls of a planning context,
    a few seconds of CPU on a loaded machine that a request would otherwise pay for. Failing here
    is no reason to lose the spare: the request pays instead."""
    from .warm_up import warm_up_kafka

    t0 = time.monotonic()
    warm_up_kafka(spark)
    result = plan_build(spark, args, workdir, _warm_up_pipeline, "the warm-up pipeline", [], {}, 1, t0)
    outcome = "planned" if result.get("ok") else f"failed ({result.get('error')})"
    print(f"planner warm-up: {outcome} in {time.monotonic() - t0:.2f} s", file=sys.stderr, flush=True)


def await_and_plan(args: argparse.Namespace, workdir: Path, spark_box: list, out) -> dict[str, Any]:
    """A warm planner: the session first, then one request from stdin. An end of input before it
    (the dispatcher went away) ends the process without a result."""
    try:
        spark_box.append(_session(args, workdir))
    except Exception as exc:  # noqa: BLE001 - reported on stdout
        return _failure("spark", exc)
    warm_up_plan(spark_box[0], args, workdir)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    line = sys.stdin.readline()
    if not line.strip():
        return {"ok": False, "stage": "spark", "error": "no request came (end of input)"}
    t0 = time.monotonic()
    try:
        req = json.loads(line)
        program_args = [str(a) for a in req.get("args") or []]
        config = dict(req.get("config") or {})
        artifact, entry, parallelism = (
            str(req["artifact"]),
            str(req.get("entry") or "build"),
            int(req.get("parallelism") or 1),
        )
    except (ValueError, TypeError, KeyError) as exc:
        return _failure("build", exc)
    return plan_in(
        spark_box[0],
        args,
        workdir,
        artifact=artifact,
        entry=entry,
        program_args=program_args,
        config=config,
        parallelism=parallelism,
        t0=t0,
    )


def _stop(spark) -> None:
    """Stop Spark and wait for its JVM: a JVM that outlives us is re-parented to init, which may
    never reap it."""
    from .driver_io import stop_spark_quietly

    jvm = getattr(spark.sparkContext._gateway, "proc", None)
    stop_spark_quietly(spark, 10.0)
    if jvm is not None:
        try:
            jvm.stdin.close()  # the JVM exits when its stdin closes
            jvm.wait(10)
        except Exception:  # noqa: BLE001 - the caller kills our process group anyway
            pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.artifact is None and not args.await_request:
        print("planner: --artifact is required (or --await-request)", file=sys.stderr)
        return 2
    # The one result line needs a clean stdout: whatever else prints (the pipeline at import,
    # the JVM we start) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="headrace-planner-") if own_workdir else args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    spark_box: list = []
    try:
        result = await_and_plan(args, workdir, spark_box, out) if args.await_request else plan(args, workdir, spark_box)
    except BaseException as exc:  # noqa: BLE001 - one line, whatever happened
        result = _failure("spark", exc)
    try:
        out.write(json.dumps(result, default=str) + "\n")
        out.flush()
    except BrokenPipeError:
        pass  # nobody reads it any more (a warm planner's dispatcher went away): Spark still stops
    if spark_box:
        _stop(spark_box[0])
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.stderr.flush()
    os._exit(0)  # Py4J threads must not keep the process alive


if __name__ == "__main__":
    main()
