"""A failure cause summarised as the exception's type and message (shared/failure_summary.py), on
Python tracebacks made here and on real PySpark and Py4J failures: the files in failure_traces/
are what a driver reports (`<type name>: ` + services/taskmanager/runtime/reports.format_failure),
captured from PySpark 4.2 on Java 17 with a JVM call to a missing class, a streaming query whose
UDF raises, a batch job whose task raises, a missing data source and an unresolved column (with
spark.sql.pyspark.jvmStacktrace.enabled)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from shared.failure_summary import LIMIT, summarize

TRACES = Path(__file__).parent / "failure_traces"


def stored(exc: BaseException) -> str:
    """The cause as the JobManager stores a driver's failure: `<name>: <traceback>`."""
    return f"{type(exc).__name__}: " + "".join(traceback.format_exception(exc))


def raised(f) -> BaseException:
    try:
        f()
    except BaseException as exc:  # noqa: BLE001 - whatever it raised is the case under test
        return exc
    raise AssertionError("did not raise")


def parse_event(raw: str) -> int:
    return int(raw.split("=")[1])


def build() -> None:
    parse_event("key")


def test_a_python_traceback_gives_its_last_line_not_its_first():
    cause = stored(raised(build))
    assert cause.splitlines()[0] == "IndexError: Traceback (most recent call last):"
    assert summarize(cause) == "IndexError: list index out of range"


def test_a_chained_python_exception_gives_the_one_raised_last():
    def handler() -> None:
        try:
            {}["key"]
        except KeyError as exc:
            raise ValueError("event without a key") from exc

    assert summarize(stored(raised(handler))) == "ValueError: event without a key"


def test_a_message_of_several_lines_gives_its_first():
    def multi() -> None:
        raise RuntimeError("the sink refused the batch\n  table: clicks\n  reason: full")

    assert summarize(stored(raised(multi))) == "RuntimeError: the sink refused the batch"


def test_an_exception_whose_message_is_markup_stays_text():
    def markup() -> None:
        raise RuntimeError('<img src=x onerror="1">')

    assert summarize(stored(raised(markup))) == 'RuntimeError: <img src=x onerror="1">'


@pytest.mark.parametrize(
    "trace, summary",
    [
        ("py4j_class_not_found", "ClassNotFoundException: org.example.NoSuchSink"),
        ("streaming_udf_failure", "ValueError: bad event 0: key missing"),
        ("rdd_task_zero_division", "ZeroDivisionError: integer division or modulo by zero"),
        (
            "data_source_not_found",
            "SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] Failed to find the data source: nosuchformat. "
            "Make sure the provider name is correct and the package is properly registered and compatible with "
            "your Spark version. SQLSTATE: 42K02 (caused by ClassNotFoundException: nosuchformat.DefaultSource)",
        ),
        (
            "analysis_with_jvm_stacktrace",
            "AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter "
            "with name `no_such_column` cannot be resolved. Did you mean one of the following? [`id`]. "
            "SQLSTATE: 42703; line 1 pos 7;",
        ),
    ],
)
def test_real_pyspark_and_py4j_failures(trace, summary):
    text = (TRACES / f"{trace}.txt").read_text()
    assert "Traceback (most recent call last):" in text.splitlines()[0]
    assert summarize(text) == summary


def test_a_java_trace_with_causes_names_the_thrown_exception_and_the_root_cause():
    trace = "\n".join(
        [
            "org.apache.spark.SparkException: Writing job aborted",
            "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.writingJobAbortedError"
            "(QueryExecutionErrors.scala:767)",
            "\tat org.apache.spark.sql.execution.datasources.v2.V2TableWriteExec.writeWithV2"
            "(WriteToDataSourceV2.scala:9)",
            "Caused by: org.postgresql.util.PSQLException: Connection to 127.0.0.1:5433 refused.",
            "\tat org.postgresql.core.v3.ConnectionFactoryImpl.openConnectionImpl(ConnectionFactoryImpl.java:342)",
            "\t... 12 more",
            "Caused by: java.net.ConnectException: Connection refused",
            "\tat java.base/sun.nio.ch.Net.pollConnect(Native Method)",
            "\t... 20 more",
        ]
    )
    assert summarize(trace) == ("SparkException: Writing job aborted (caused by ConnectException: Connection refused)")


def test_a_long_message_is_cut_but_keeps_its_root_cause():
    trace = (
        f"java.lang.IllegalStateException: {'x' * 500}\n\tat a.B.c(B.java:1)\n"
        "Caused by: java.io.IOException: disk full\n\tat a.B.d(B.java:2)"
    )
    out = summarize(trace)
    assert out is not None and len(out) <= LIMIT
    assert out.startswith("IllegalStateException: xxx") and out.endswith("… (caused by IOException: disk full)")


def test_a_cause_headrace_wrote_itself_is_its_first_line():
    lost = "TaskManagerLost: tm-2 sent no heartbeat for 10 s"
    assert summarize(lost) == lost
    assert summarize("CheckpointException: Exceeded checkpoint tolerable failure threshold\nmore") == (
        "CheckpointException: Exceeded checkpoint tolerable failure threshold"
    )
    assert summarize("x" * 400) == "x" * (LIMIT - 1) + "…"


def test_no_cause():
    assert summarize(None) is None
    assert summarize("  \n ") is None
