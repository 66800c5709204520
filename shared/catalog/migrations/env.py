from alembic import context
from sqlalchemy import create_engine

from shared.catalog.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    conn = config.attributes.get("connection")
    if conn is None:
        url = config.get_main_option("sqlalchemy.url")
        if url is None:  # shared/catalog/db.py sets it, or passes a connection
            raise RuntimeError("alembic: neither a connection nor sqlalchemy.url was given")
        engine = create_engine(url)
        with engine.connect() as conn:
            context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
