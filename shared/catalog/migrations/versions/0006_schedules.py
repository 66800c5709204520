"""schedules: scheduled submissions, their runs, and the schedule a job is a run of

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("artifact_id", sa.String(length=160), nullable=False),
        sa.Column("entry", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("parallelism", sa.Integer(), nullable=False),
        sa.Column("program_args", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("restart_strategy", sa.JSON(), nullable=False),
        sa.Column("cron", sa.String(length=255), nullable=True),
        sa.Column("every_s", sa.Integer(), nullable=True),
        sa.Column("overlap", sa.String(length=16), nullable=False),
        sa.Column("misfire_grace_s", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_schedules_next_fire_at", "schedules", ["next_fire_at"])
    # One row per tick: the unique key is what makes a tick fire once across a leader change.
    op.create_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.String(length=32), nullable=False),
        sa.Column("tick_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("outcome", sa.String(length=24), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("schedule_id", "tick_at"),
    )
    op.create_index("ix_schedule_runs_schedule_id", "schedule_runs", ["schedule_id"])
    op.add_column("jobs", sa.Column("schedule_id", sa.String(length=32), nullable=True))
    op.create_index("ix_jobs_schedule_id", "jobs", ["schedule_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_schedule_id", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("schedule_id")
    op.drop_table("schedule_runs")
    op.drop_index("ix_schedules_next_fire_at", table_name="schedules")
    op.drop_table("schedules")
