"""The SQL sink's table creation when another writer creates the same table at the same moment."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from services.taskmanager.runtime.connectors.sql_tables import create_all


def _table(md):
    return sa.Table("clicks", md, sa.Column("url", sa.Text, primary_key=True), sa.Column("n", sa.BigInteger))


def test_a_concurrent_creator_of_the_same_table_is_not_an_error(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sink.db'}")
    md = sa.MetaData()
    table = _table(md)

    @sa.event.listens_for(table, "before_create")
    def the_other_task_wins_the_race(target, connection, **kw):
        # After our existence check said "missing", another process creates it first.
        other = sa.create_engine(f"sqlite:///{tmp_path / 'sink.db'}")
        _table(sa.MetaData()).create(other)
        other.dispose()

    create_all(md, engine)
    assert "clicks" in sa.inspect(engine).get_table_names()


def test_a_real_creation_error_still_raises(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sink.db'}")
    md = sa.MetaData()
    sa.Table("bad", md, sa.Column("x", sa.Integer, primary_key=True), sa.CheckConstraint("no_such_column > 0"))
    with pytest.raises(sa.exc.DBAPIError):
        create_all(md, engine)
