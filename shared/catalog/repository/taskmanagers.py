"""TaskManagers as the ResourceManager registers them: registration (one or many), slots,
heartbeats, loss."""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from shared.catalog.models import TaskManagerRow, utcnow
from shared.catalog.repository.rows import NotFound
from shared.ids import TaskManagerId


def register_taskmanager(
    s: Session,
    *,
    id: TaskManagerId,
    host: str,
    queue: str,
    slots_total: int,
    slots_free: int,
    cores: float,
    memory_bytes: int,
    allocations: list[dict],
) -> TaskManagerRow:
    row = s.get(TaskManagerRow, id)
    now = utcnow()
    if row is None:
        row = TaskManagerRow(id=id, registered_at=now)
        s.add(row)
    row.host, row.queue, row.state = host, queue, "REGISTERED"
    row.slots_total, row.slots_free, row.cores, row.memory_bytes = slots_total, slots_free, cores, memory_bytes
    row.allocations, row.last_heartbeat, row.lost_reason = allocations, now, None
    s.flush()
    return row


def register_taskmanagers(s: Session, rows: list[dict]) -> None:
    """`register_taskmanager` for many at once: one SELECT, one bulk INSERT, one executemany
    UPDATE (10,000 TaskManagers registering after a ResourceManager restart cost 20,000 round
    trips one by one). Each row: the keyword arguments of register_taskmanager."""
    if not rows:
        return
    now = utcnow()
    ids = [r["id"] for r in rows]
    existing: set[TaskManagerId] = set()
    for i in range(0, len(ids), 1000):
        existing.update(s.execute(select(TaskManagerRow.id).where(TaskManagerRow.id.in_(ids[i : i + 1000]))).scalars())
    values = [dict(r, state="REGISTERED", last_heartbeat=now, lost_reason=None) for r in rows]
    new = [dict(v, registered_at=now) for v in values if v["id"] not in existing]
    old = [v for v in values if v["id"] in existing]
    if new:
        s.execute(insert(TaskManagerRow), new)
    if old:
        s.execute(update(TaskManagerRow), old)


def update_taskmanager_slots(s: Session, rows: list[dict]) -> None:
    """Free slot counts and allocations of many TaskManagers (keys: id, slots_free, allocations)
    in one executemany: when thousands of tasks start at once, an UPDATE statement each was half
    of the ResourceManager's time."""
    if rows:
        s.execute(update(TaskManagerRow), rows)


def touch_taskmanagers(s: Session, last_seen: dict[TaskManagerId, datetime]) -> None:
    """Heartbeat times of many TaskManagers in one executemany (an UPDATE each would cost
    thousands of round trips per second at scale)."""
    if last_seen:
        s.execute(update(TaskManagerRow), [{"id": tm_id, "last_heartbeat": at} for tm_id, at in last_seen.items()])


def mark_taskmanager_gone(s: Session, taskmanager_id: TaskManagerId, *, state: str, reason: str) -> None:
    s.execute(
        update(TaskManagerRow)
        .where(TaskManagerRow.id == taskmanager_id)
        .values(state=state, lost_reason=reason, slots_free=0, allocations=[])
    )


def record_taskmanager_losses(s: Session, losses: dict[TaskManagerId, tuple[datetime, str]]) -> None:
    """The latest loss (when, why) of many TaskManagers. Kept in its own columns, which a new
    registration leaves alone: a TaskManager restarted within seconds still shows it was lost."""
    if losses:
        s.execute(
            update(TaskManagerRow),
            [{"id": tm_id, "last_lost_at": at, "last_lost_reason": reason} for tm_id, (at, reason) in losses.items()],
        )


def list_taskmanagers(s: Session, *, include_gone: bool = False) -> Sequence[TaskManagerRow]:
    q = select(TaskManagerRow).order_by(TaskManagerRow.id)
    if not include_gone:
        q = q.where(TaskManagerRow.state == "REGISTERED")
    return s.execute(q).scalars().all()


def get_taskmanager(s: Session, taskmanager_id: TaskManagerId) -> TaskManagerRow:
    row = s.get(TaskManagerRow, taskmanager_id)
    if row is None:
        raise NotFound(f"taskmanager {taskmanager_id} not found")
    return row
