"""What every entity's functions share: the two errors, row locks that later reads reuse, and
named counters."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import Table, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from shared.catalog.models import Base, Sequence_
from shared.errors import CoordinationError, NotFoundError


class NotFound(NotFoundError, LookupError):
    pass


class StaleEpoch(CoordinationError, RuntimeError):
    """A write by a JobManager whose leadership has since passed to a newer epoch."""


def _locked(s: Session) -> set:
    """Identity keys of rows this transaction has already locked (SELECT ... FOR UPDATE)."""
    return s.info.setdefault("headrace_locked", set())


def lock_rows(s: Session, model, ids) -> Sequence:
    """Load and lock many rows in one statement; later get_* calls for them cost no SQL."""
    ids = list(ids)
    if not ids:
        return []
    rows = s.execute(select(model).where(model.id.in_(ids)).with_for_update()).scalars().all()
    _locked(s).update(identity_key(model, r.id) for r in rows)
    pin(s, rows)
    return rows


def table_of(model: type[Base]) -> Table:
    """The model's Core table, for bulk INSERTs (thousands of ORM objects cost more to track than
    to write). Declarative types `__table__` as any FromClause; a mapped class's is a Table."""
    table = model.__table__
    if not isinstance(table, Table):
        raise TypeError(f"{model.__name__} is not mapped to a table")
    return table


def pin(s: Session, rows) -> None:
    """The identity map holds rows weakly: keep prefetched ones alive for the transaction."""
    s.info.setdefault("headrace_pinned", []).extend(rows)


def get_row(s: Session, model, pk: str, lock: bool):
    """The row of `model` with primary key `pk` or None; locked (FOR UPDATE) if `lock`, and read
    from the session without SQL when it holds it already (locked, if a lock is asked for)."""
    key = identity_key(model, pk)
    if not lock or key in _locked(s):  # an unlocked read may use any row already loaded
        row = s.identity_map.get(key)
        if row is not None:
            return row
    q = select(model).where(model.id == pk)
    if lock:
        q = q.with_for_update()
    row = s.execute(q).scalar_one_or_none()
    if row is not None and lock:
        _locked(s).add(key)
    return row


def next_value(s: Session, name: str) -> int:
    """The next value of the named counter (1, 2, ...), under a row lock."""
    row = s.execute(select(Sequence_).where(Sequence_.name == name).with_for_update()).scalar_one_or_none()
    if row is None:
        row = Sequence_(name=name, value=0)
        s.add(row)
        s.flush()
    row.value += 1
    s.flush()
    return row.value
