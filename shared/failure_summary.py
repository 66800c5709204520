"""One line for a failure cause: the exception's type and message, never a stack trace's first line.

A failed attempt's cause is stored whole (`<name>: <the driver's traceback>`, as
services/jobmanager/restarts.py records it) and shown whole in the job's exception history.
Wherever a cause is summarised instead (a deployment's status, error and history, the dashboard's
attempts, `headrace run --wait`, `headrace deploy list|show`), its first line would read
`ValueError: Traceback (most recent call last):`. What an operator needs is the exception that was
raised, which a trace prints last:

  * a Python traceback ends with it, after its last frame (`  File "…", line N, in f` and the
    indented lines under it); PySpark nests the Python worker's traceback in the message of the
    exception it raises (`[PYTHON_EXCEPTION] … Traceback …`), and the innermost is the user's;
  * a Java trace (a Py4JJavaError's `: java.lang.X: …`, PySpark's `JVM stacktrace:`) prints an
    exception's line before its `\tat …` frames, and its root cause last (`Caused by: …`).

So the summary is the last exception line of the text: the first unindented line after a Python
frame, or the line that opens a Java exception's frames; a Java exception with a cause also names
its root cause (`SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] … (caused by
ClassNotFoundException: nosuchformat.DefaultSource)`). With neither, it is the text's first line (a
cause Headrace wrote itself, such as `TaskManagerLost: …`). Types keep their last name only
(`StreamingQueryException`, not `pyspark.errors.exceptions.captured.StreamingQueryException`), and
the line is cut at `limit` characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LIMIT = 300
ROOT_LIMIT = 120  # of the root cause's part, so that a long message leaves room for it
PYTHON_FRAME = re.compile(r'^\s+File "')
JAVA_FRAME = re.compile(r"^\s+(at \S|\.\.\. \d+ (more|common frames omitted))")
# `Caused by: x.Y: m`, Py4J's `: x.Y: m`, `Suppressed: …`, or a plain `x.YException: m` line.
JAVA_HEADER = re.compile(
    r"^(?P<kind>Caused by: |Suppressed: |: )?(?P<line>[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*"
    r"(?:Exception|Error|Throwable)\b.*)$"
)
QUALIFIED_TYPE = re.compile(r"^(?:[A-Za-z_$][\w$]*\.)+(?=[A-Za-z_$][\w$]*(?::|$))")
TRACEBACK_HEADER = "Traceback (most recent call last):"


@dataclass
class _Found:
    index: int
    line: str
    java: bool
    root: str | None = None  # a Java exception's deepest `Caused by:`


def summarize(cause: str | None, *, limit: int = LIMIT) -> str | None:
    """The exception's type and message as one line (see the module's docstring); None for no cause."""
    if cause is None:
        return None
    lines = cause.strip().splitlines()
    if not lines:
        return None
    found = _last_exception(lines)
    if found is None:
        return _cut(lines[0].strip(), limit)
    line = _short(found.line)
    if found.root is None or found.root in found.line:
        return _cut(line, limit)
    root = f" (caused by {_cut(_short(found.root), ROOT_LIMIT)})"
    return _cut(line, max(limit - len(root), limit // 2)) + root


def _last_exception(lines: list[str]) -> _Found | None:
    best: _Found | None = None
    in_frame = False
    for i, line in enumerate(lines):
        if PYTHON_FRAME.match(line):
            in_frame = True
            continue
        if in_frame and line[:1].isspace():
            continue  # the frame's source line and its ^^^ markers
        if in_frame and line.strip() and _names_a_message(line):
            best = _Found(i, line, java=False)
        in_frame = False
        if not JAVA_FRAME.match(line) or (i and JAVA_FRAME.match(lines[i - 1])):
            continue
        header = _java_header(lines, i)
        if header is None:
            continue
        at, kind, text = header
        if kind == "Suppressed: " or not _names_a_message(text):
            continue
        if kind == "Caused by: " and best is not None and best.java:
            best.root = text  # the chain goes on: the deepest cause is printed last
        elif best is None or at >= best.index:
            best = _Found(at, text, java=True)
    return best


def _names_a_message(line: str) -> bool:
    # `ValueError: Traceback (most recent call last):` names no message: what follows does.
    return not line.rstrip().endswith(TRACEBACK_HEADER)


def _java_header(lines: list[str], first_frame: int) -> tuple[int, str, str] | None:
    """The exception line that opens the frames starting at `first_frame`: the nearest line
    above them that names an exception (its message may take several lines)."""
    for j in range(first_frame - 1, max(-1, first_frame - 40), -1):
        match = JAVA_HEADER.match(lines[j])
        if match:
            return j, match.group("kind") or "", match.group("line")
        if JAVA_FRAME.match(lines[j]):
            return None
    return None


def _short(line: str) -> str:
    return QUALIFIED_TYPE.sub("", line.strip())


def _cut(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
