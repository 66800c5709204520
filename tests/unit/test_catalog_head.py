"""The catalog skips Alembic when its schema is at the head; the head it reads from the migration
files must be Alembic's own."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

from shared.catalog import Catalog
from shared.catalog.db import MIGRATIONS, head_revision


def test_head_read_from_the_files_is_alembics_head():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    assert head_revision() == ScriptDirectory.from_config(cfg).get_current_head()


def test_a_migrated_catalog_is_at_head_and_a_new_one_is_not(tmp_path):
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    assert not catalog.at_head()
    catalog.migrate()
    assert catalog.at_head()
    catalog.migrate()  # a no-op now
    assert catalog.at_head()
