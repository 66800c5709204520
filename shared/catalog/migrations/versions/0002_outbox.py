"""outbox: the JobManager's messages and commands, committed with the state change that caused them

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=160), nullable=False),
        sa.Column("execution_id", sa.String(length=32), nullable=True),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_outbox_seq", "outbox", ["seq"])


def downgrade() -> None:
    op.drop_index("ix_outbox_seq", table_name="outbox")
    op.drop_table("outbox")
