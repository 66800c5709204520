"""The state diagrams in shared/states.py's docstring and in docs/architecture.md ("State
machines") show exactly the moves the code allows: the transition tables of shared/states.py
(with a deployment's first states, `DEPLOYMENT_START`), and for operations the rule of
`finish_operation` (an operation ends once). A move added to a
table, or to a diagram, without the other fails here; so does a diagram line this module cannot
read, so that no move can hide in another notation.

A diagram is a block that starts with an unindented line naming a machine and ending with ":"
(`JobStatus (one per job)::`), followed by indented lines, each either `STATE -> NEXT | NEXT`
(several lines may share a state), `terminal: STATE, STATE` (none when every state has a way
out) or `start: STATE, STATE` (a machine whose rows start with no state); `#` starts a note."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy.orm import Session

from shared import states
from shared.catalog.models import Operation
from shared.catalog.repository.operations import finish_operation
from shared.states import CheckpointStatus, ExecutionState, JobStatus, Lifecycle, OperationStatus

ROOT = Path(__file__).resolve().parents[2]

MACHINES: dict[str, type[Enum]] = {
    "JobStatus": JobStatus,
    "ExecutionState": ExecutionState,
    "CheckpointStatus": CheckpointStatus,
    "OperationStatus": OperationStatus,
    "Lifecycle": Lifecycle,
}
HEADER = re.compile(rf"^({'|'.join(MACHINES)})\b.*:$")
MOVE = re.compile(r"^([A-Z_]+)\s*->\s*([A-Z_]+(?:\s*\|\s*[A-Z_]+)*)$")
TERMINAL = re.compile(r"^terminal:\s*([A-Z_]+(?:\s*,\s*[A-Z_]+)*)$")
START = re.compile(r"^start:\s*([A-Z_]+(?:\s*,\s*[A-Z_]+)*)$")

Edge = tuple[str, str]


class Diagram:
    def __init__(self, machine: str):
        self.machine = machine
        self.edges: set[Edge] = set()
        self.terminal: set[str] | None = None
        self.start: set[str] | None = None

    def read(self, line: str) -> None:
        text = line.split("#", 1)[0].strip()
        if not text:
            return
        if (move := MOVE.match(text)) is not None:
            source = move.group(1)
            for target in (t.strip() for t in move.group(2).split("|")):
                assert (source, target) not in self.edges, f"{self.machine}: {source} -> {target} is listed twice"
                self.edges.add((source, target))
        elif (terminal := TERMINAL.match(text)) is not None:
            assert self.terminal is None, f"{self.machine}: two `terminal:` lines"
            self.terminal = {t.strip() for t in terminal.group(1).split(",")}
        elif (start := START.match(text)) is not None:
            assert self.start is None, f"{self.machine}: two `start:` lines"
            self.start = {t.strip() for t in start.group(1).split(",")}
        else:
            raise AssertionError(
                f"{self.machine}: cannot read the diagram line {line.strip()!r} "
                f"(write `STATE -> NEXT | NEXT`, `terminal: STATE, STATE` or `start: STATE, STATE`)"
            )


def read_diagrams(text: str) -> dict[str, Diagram]:
    diagrams: dict[str, Diagram] = {}
    current: Diagram | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            if current is not None:
                current.read(line)
            continue
        current = None
        if (header := HEADER.match(line.rstrip())) is not None:
            machine = header.group(1)
            assert machine not in diagrams, f"two diagrams of {machine}"
            current = diagrams[machine] = Diagram(machine)
    return diagrams


def table_edges(table: dict) -> set[Edge]:
    return {(source.value, target.value) for source, targets in table.items() for target in targets}


def operation_edges() -> set[Edge]:
    """What `finish_operation` does, tried on every pair of statuses: the move happened or not."""
    edges: set[Edge] = set()
    for source in OperationStatus:
        for target in OperationStatus:
            if source == target:
                continue
            op = Operation(id="op", kind="savepoint", status=source.value)
            finish_operation(cast(Session, None), op, target)  # it needs no session
            if op.status == target.value:
                edges.add((source.value, target.value))
    return edges


CODE: dict[str, set[Edge]] = {
    "JobStatus": table_edges(states.JOB_TRANSITIONS),
    "ExecutionState": table_edges(states.EXECUTION_TRANSITIONS),
    "CheckpointStatus": table_edges(states.CHECKPOINT_TRANSITIONS),
    "OperationStatus": operation_edges(),
    "Lifecycle": table_edges(states.DEPLOYMENT_TRANSITIONS),
}
# The states a machine's rows may start in, for a machine whose rows start with none (a
# deployment's lifecycle is null until first reconciled); the others' rows are created in a state.
STARTS: dict[str, set[str]] = {"Lifecycle": {s.value for s in states.DEPLOYMENT_START}}

DOCUMENTS = {
    "shared/states.py": lambda: states.__doc__ or "",
    "docs/architecture.md": lambda: (ROOT / "docs/architecture.md").read_text(),
}


def test_the_tables_cover_every_state():
    for machine, table in (
        ("JobStatus", states.JOB_TRANSITIONS),
        ("ExecutionState", states.EXECUTION_TRANSITIONS),
        ("CheckpointStatus", states.CHECKPOINT_TRANSITIONS),
        ("Lifecycle", states.DEPLOYMENT_TRANSITIONS),
    ):
        assert set(table) == set(MACHINES[machine]), machine


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_each_document_has_one_diagram_of_each_machine(document):
    assert set(read_diagrams(DOCUMENTS[document]())) == set(MACHINES)


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_a_diagram_shows_exactly_the_legal_moves(document, machine):
    diagram = read_diagrams(DOCUMENTS[document]())[machine]
    legal = CODE[machine]
    missing, extra = sorted(legal - diagram.edges), sorted(diagram.edges - legal)
    assert not missing and not extra, (
        f"{document}, {machine}: moves the code allows but the diagram omits: {missing}; "
        f"moves the diagram shows but the code refuses: {extra}"
    )


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_a_diagram_names_the_terminal_states(document, machine):
    diagram = read_diagrams(DOCUMENTS[document]())[machine]
    members = {s.value for s in MACHINES[machine]}
    no_way_out = members - {source for source, _ in CODE[machine]}
    if no_way_out:
        assert diagram.terminal == no_way_out, (
            f"{document}, {machine}: `terminal:` must list exactly {sorted(no_way_out)}"
        )
    else:
        assert diagram.terminal is None, f"{document}, {machine}: every state has a way out: no `terminal:` line"
    named = {s for edge in diagram.edges for s in edge} | (diagram.terminal or set()) | (diagram.start or set())
    assert named <= members, f"{document}, {machine}: no such state: {sorted(named - members)}"


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_a_diagram_names_the_start_states(document, machine):
    diagram = read_diagrams(DOCUMENTS[document]())[machine]
    assert diagram.start == STARTS.get(machine), (
        f"{document}, {machine}: `start:` must list exactly {sorted(STARTS[machine])}"
        if machine in STARTS
        else f"{document}, {machine}: its rows are created in a state: no `start:` line"
    )


def test_terminal_states_are_the_ones_no_move_leaves():
    for machine, members in (("JobStatus", list(JobStatus)), ("ExecutionState", list(ExecutionState))):
        assert {s.value for s in members if s.is_terminal} == (
            {s.value for s in members} - {source for source, _ in CODE[machine]}
        ), machine


def test_a_start_line_is_read():
    diagrams = read_diagrams("Lifecycle::\n\n    start: DEPLOYING, SUSPENDED  # note\n    SUSPENDED -> DEPLOYING\n")
    assert diagrams["Lifecycle"].start == {"DEPLOYING", "SUSPENDED"}
    assert diagrams["Lifecycle"].edges == {("SUSPENDED", "DEPLOYING")}


def test_a_move_in_another_notation_is_refused():
    with pytest.raises(AssertionError, match="cannot read"):
        read_diagrams("JobStatus::\n\n    CREATED -> RUNNING\n    RUNNING → FINISHED\n")


def test_a_block_ends_at_the_first_unindented_line():
    diagrams = read_diagrams(
        "JobStatus::\n\n    CREATED -> RUNNING | FAILED  # note\nprose -> not a move\n    RUNNING -> FINISHED\n"
    )
    assert diagrams["JobStatus"].edges == {("CREATED", "RUNNING"), ("CREATED", "FAILED")}
