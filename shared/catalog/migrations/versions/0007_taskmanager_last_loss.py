"""taskmanagers: the last loss (when, why), kept after the TaskManager registered again

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # lost_reason is cleared when a TaskManager registers again; under a supervisor that restarts
    # it within seconds the loss would leave no trace in its record without these.
    op.add_column("taskmanagers", sa.Column("last_lost_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("taskmanagers", sa.Column("last_lost_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("taskmanagers", "last_lost_reason")
    op.drop_column("taskmanagers", "last_lost_at")
