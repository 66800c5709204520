"""Reports only from the TaskManager that holds the execution (issue 21, finding 3).

The transport has already checked that a report's sender is who it claims to be and that a
TaskManager names only itself (shared/message_auth.py). What it cannot know is whether that
TaskManager holds the execution the report is about: the catalog does. A TaskStateChanged,
TaskProgress, CheckpointAcknowledged/Declined, CommandRejected or RedisKeysClaimed about an execution the catalog
places on another TaskManager (or on none yet) is refused, and the transport dead-letters it with
the reason; before this, a FINISHED sent by tm-2 for tm-1's attempt finished the job while its
driver went on writing.

An execution the catalog does not know passes: every handler ignores it already, and refusing
it would only fill the dead letters with the reports of a deleted job.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from shared.catalog import repository as repo
from shared.message_auth import SELF_ONLY, TASKMANAGER_MESSAGES, RefusedMessage, taskmanager_of
from shared.messages import Envelope

# What a TaskManager sends about an execution: everything it may send but its own membership.
REPORTS = tuple(m for m in TASKMANAGER_MESSAGES if m not in SELF_ONLY)


def check_report_sender(env: Envelope, s: Session) -> None:
    """Raises RefusedMessage unless `env` (a report) comes from the execution's TaskManager."""
    body = env.body
    tm = taskmanager_of(env.sender)
    execution_id = getattr(body, "execution_id", None)
    if tm is None:
        raise RefusedMessage(
            f"{body.type} about execution {execution_id} comes from {env.sender!r}: only the "
            f"TaskManager that holds an execution reports on it"
        )
    if execution_id is None:
        return  # a CommandRejected of a command it could not read: it names only its sender
    ex = repo.find_execution(s, execution_id)  # locked and prefetched with the batch: no round trip
    if ex is None or ex.taskmanager_id == tm:
        return
    raise RefusedMessage(
        f"execution {execution_id} is held by {ex.taskmanager_id or 'no TaskManager yet'}, not by "
        f"{tm}: its {body.type} is refused"
    )
