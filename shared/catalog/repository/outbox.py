"""The JobManager's transactional outbox: the effects of a unit of work, written with it and
sent after it commits."""

from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from shared.catalog.models import OutboxEntry


def add_outbox(s: Session, entries: list[dict]) -> None:
    """One bulk INSERT for every effect of a unit of work (keys: the OutboxEntry columns)."""
    if entries:
        s.execute(insert(OutboxEntry), entries)


def pending_outbox(s: Session, *, limit: int | None = 1000) -> Sequence[OutboxEntry]:
    return s.execute(select(OutboxEntry).order_by(OutboxEntry.seq).limit(limit)).scalars().all()


def delete_outbox(s: Session, ids: Iterable[str]) -> None:
    ids = list(ids)
    for i in range(0, len(ids), 1000):
        s.execute(delete(OutboxEntry).where(OutboxEntry.id.in_(ids[i : i + 1000])))


def count_outbox(s: Session) -> int:
    return s.scalar(select(func.count()).select_from(OutboxEntry)) or 0
