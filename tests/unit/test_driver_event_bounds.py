"""A driver's events are bounded where the TaskManager reads them (issue 43, finding 9): a line
too long is dropped as it streams in, never held; every string an event carries is cut to its
bound as it decodes, a traceback keeping its head and its tail."""

from __future__ import annotations

import os
import threading

from services.taskmanager.drivers.events import bounded_lines
from shared import task_protocol as tp


def lines_of(data: bytes, max_bytes: int) -> tuple[list[bytes], list[int]]:
    r, w = os.pipe()
    dropped: list[int] = []

    def feed() -> None:
        for i in range(0, len(data), 7000):
            os.write(w, data[i : i + 7000])
        os.close(w)

    t = threading.Thread(target=feed)
    t.start()
    try:
        return list(bounded_lines(r, max_bytes, on_dropped=dropped.append)), dropped
    finally:
        t.join()
        os.close(r)


def test_lines_within_the_bound_arrive_whole_and_an_overlong_one_is_dropped():
    long = b"x" * 50_000 + b"\n"
    lines, dropped = lines_of(b"a\n" + long + b"b\n" + long + b"c", 10_000)
    assert lines == [b"a\n", b"b\n", b"c"]
    assert dropped == [len(long), len(long)]


def test_a_line_exactly_at_the_bound_is_kept():
    line = b"y" * 99 + b"\n"
    assert lines_of(line * 3, 100) == ([line] * 3, [])


def test_an_overlong_line_cut_by_eof_is_dropped_too():
    assert lines_of(b"ok\n" + b"z" * 300, 100) == ([b"ok\n"], [300])


def test_a_huge_traceback_keeps_its_head_and_its_tail_with_a_note():
    text = "HEAD " + "m" * 500_000 + " TAIL"
    event = tp.decode_event(tp.Failed(error_name="E" * 5000, traceback=text).model_dump_json())
    assert len(event.traceback) <= tp.MAX_TRACEBACK_CHARS
    assert event.traceback.startswith("HEAD ") and event.traceback.endswith(" TAIL")
    assert "characters cut: the driver sent 500010" in event.traceback
    assert len(event.error_name) <= tp.MAX_NAME_CHARS


def test_every_string_of_an_event_is_bounded():
    big = "r" * 100_000
    assert len(tp.decode_event(tp.Waiting(reason=big).model_dump_json()).reason) <= tp.MAX_TEXT_CHARS
    declined = tp.decode_event(tp.SnapshotDeclined(checkpoint_id=1, reason=big).model_dump_json())
    assert len(declined.reason) <= tp.MAX_TEXT_CHARS
    taken = tp.decode_event(
        tp.SnapshotTaken(
            checkpoint_id=1, path=big, batch_id=0, state_size=0, duration_ms=0, source_offsets=("o",) * 5000
        ).model_dump_json()
    )
    assert len(taken.path) <= tp.MAX_TEXT_CHARS and len(taken.source_offsets) == tp.MAX_LIST_ITEMS
    progress = tp.decode_event(
        tp.Progress(batch_id=1, spark_ui=big, partition_lag={f"t/{i}": i for i in range(5000)}).model_dump_json()
    )
    assert len(progress.spark_ui) <= tp.MAX_TEXT_CHARS and len(progress.partition_lag) == tp.MAX_LIST_ITEMS


def test_short_strings_pass_unchanged():
    assert tp.cut("short", 10) == "short"
    assert tp.decode_event(tp.Failed(error_name="ValueError", traceback="tb").model_dump_json()) == tp.Failed(
        error_name="ValueError", traceback="tb"
    )
