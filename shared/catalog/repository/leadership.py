"""The `leadership` row: the newest leader epoch, claimed by a JobManager when it takes over and
checked as the last statement of each of its units of work."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.catalog.models import Leadership, utcnow
from shared.catalog.repository.rows import StaleEpoch

LEADERSHIP_ROW = 1


def claim_leadership(s: Session, epoch: int, leader: str) -> None:
    """Make `epoch` the catalog's leader epoch; StaleEpoch if a newer leader claimed it already.
    The row lock waits for a deposed leader's transaction in flight, which then commits before
    the claim (it was still the leader) or fails its own check after it."""
    row = s.execute(select(Leadership).where(Leadership.id == LEADERSHIP_ROW).with_for_update()).scalar_one_or_none()
    if row is None:
        s.add(Leadership(id=LEADERSHIP_ROW, epoch=epoch, leader=leader, since=utcnow()))
        s.flush()
        return
    if row.epoch > epoch:
        raise StaleEpoch(f"the catalog's leader epoch is {row.epoch} ({row.leader}); this JobManager has {epoch}")
    row.epoch, row.leader, row.since = epoch, leader, utcnow()


def check_leadership(s: Session, epoch: int) -> None:
    """Lock the leadership row and raise StaleEpoch unless `epoch` still holds it: the last
    statement of every unit of work of a leader, so the check and the commit are atomic."""
    row = s.execute(
        select(Leadership.epoch).where(Leadership.id == LEADERSHIP_ROW).with_for_update()
    ).scalar_one_or_none()
    if row != epoch:
        raise StaleEpoch(
            f"leadership passed to epoch {row}; this JobManager has epoch {epoch}: nothing it "
            "decided in this unit of work is committed"
        )


def leadership_epoch(s: Session) -> int:
    return int(s.execute(select(Leadership.epoch).where(Leadership.id == LEADERSHIP_ROW)).scalar_one_or_none() or 0)
