"""leadership row for fencing, restart-strategy state per job, artifact listing at upload

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One row: the newest JobManager epoch. Every unit of work of a leader locks it and commits
    # only while it still holds its own epoch (services/jobmanager/job_master.py).
    op.create_table(
        "leadership",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("leader", sa.String(length=255), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    # The restart strategy's counters (failures, their times), changed in the same transaction
    # as the failure they count: a redelivered failure cannot be counted twice, and a new leader
    # continues the budget.
    op.add_column("jobs", sa.Column("restart_state", sa.JSON(), nullable=True))
    # What GET /jars shows about an artifact (its entry points), computed once at upload.
    op.add_column("artifacts", sa.Column("listing", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("artifacts", "listing")
    op.drop_column("jobs", "restart_state")
    op.drop_table("leadership")
