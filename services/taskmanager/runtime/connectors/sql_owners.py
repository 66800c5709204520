"""Owners of SQL sinks: `_headrace_sink_owners`, one row per sink id (ownership.py).

Through `ctx.sinks.sql_table` a sink id is `<lineage>:<table>`, so two lineages never share one;
a pipeline that builds its sink with an explicit `sink_id` (connectors.sql.sql_sink) could reuse
another lineage's, and its fresh start would then delete that lineage's commit markers and,
on a keyless table, its rows. The owner row stops that. It is read and written inside the
prepare's transaction, after the sink's fence row is locked, so two prepares of one sink id
take turns here too and a plain insert cannot collide.

A table shared by several sink ids (several lineages) is allowed: each undoes only its own
markers and (keyless) rows; with key columns their upserts overwrite each other's keys, as
upserts do.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from .ownership import SinkOwner, check_claim, replaced_after

OWNERS_TABLE = "_headrace_sink_owners"


def owners_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        OWNERS_TABLE,
        md,
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("lineage", sa.String(512), nullable=False),
        sa.Column("job_id", sa.String(512), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("replaced", sa.Text, nullable=False),  # space-separated job ids (ownership.py)
        sa.Column("claimed_at", sa.DateTime, nullable=False),
    )


def release_hint(sink_id: str, table: str, commits_table: str, fences_table: str) -> str:
    sid = sink_id.replace("'", "''")
    return (
        f"cancel the owner's job, then in one transaction DELETE FROM {OWNERS_TABLE}, "
        f"{fences_table} and {commits_table} WHERE sink_id = '{sid}' (on a keyless table "
        f"also DELETE FROM {table} WHERE _headrace_sink = '{sid}'), or DROP TABLE {table} "
        f"with those rows"
    )


def claim(
    conn: sa.Connection,
    owners: sa.Table,
    commits: sa.Table,
    *,
    sink_id: str,
    table: str,
    owner: SinkOwner,
    restored_batch_id: int,
    fences_table: str,
) -> None:
    """Refuse (SinkOwnedError) unless `owner`'s lineage may prepare `sink_id`, then record it.
    Call inside the prepare's transaction with the fence row locked."""
    row = conn.execute(
        sa.select(owners.c.lineage, owners.c.job_id, owners.c.generation, owners.c.replaced).where(
            owners.c.sink_id == sink_id
        )
    ).first()
    current = SinkOwner(lineage=row.lineage, job_id=row.job_id, generation=row.generation) if row else None
    replaced = row.replaced.split() if row else []
    has_commits = (
        conn.execute(sa.select(commits.c.batch_id).where(commits.c.sink_id == sink_id).limit(1)).first() is not None
    )
    check_claim(
        "SQL sink",
        f"{sink_id!r} (table {table})",
        owner,
        current,
        restored_batch_id=restored_batch_id,
        has_commits=has_commits,
        release=release_hint(sink_id, table, commits.name, fences_table),
        replaced=replaced,
    )
    values = dict(
        lineage=owner.lineage,
        job_id=owner.job_id,
        generation=owner.generation,
        replaced=" ".join(replaced_after(owner, current, replaced)),
        claimed_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
    )
    if row is None:
        conn.execute(owners.insert().values(sink_id=sink_id, **values))
    else:
        conn.execute(owners.update().where(owners.c.sink_id == sink_id).values(**values))
