"""checkpoints and savepoints: their history, asynchronous operations, restore points of attempts

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("job_id", sa.String(length=32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("execution_id", sa.String(length=32), nullable=True),
        sa.Column("vertex_id", sa.String(length=32), nullable=True),
        sa.Column("request_id", sa.String(length=32), nullable=True),
        sa.Column("after", sa.String(length=16), nullable=False),
        sa.Column("trigger_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ack_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("state_size", sa.BigInteger(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("failure_cause", sa.Text(), nullable=True),
        sa.Column("source_offsets", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "checkpoint_id"),
    )
    op.create_index("ix_checkpoints_status", "checkpoints", ["status"])
    op.create_table(
        "operations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("location", sa.Text(), nullable=True),
        sa.Column("failure_cause", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_operations_job_id", "operations", ["job_id"])
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("restored_from", sa.Text(), nullable=True))
        batch.add_column(sa.Column("restored_checkpoint_id", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpoint_failures", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("checkpoint_failures")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("restored_checkpoint_id")
        batch.drop_column("restored_from")
    op.drop_index("ix_operations_job_id", table_name="operations")
    op.drop_table("operations")
    op.drop_index("ix_checkpoints_status", table_name="checkpoints")
    op.drop_table("checkpoints")
