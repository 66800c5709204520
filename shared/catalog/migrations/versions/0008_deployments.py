"""deployments: the desired state of long-running pipelines, their generations, history and
savepoints, and the deployment a job runs a generation of

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("deleting", sa.Boolean(), nullable=False),
        sa.Column("delete_with_savepoint", sa.Boolean(), nullable=False),
        sa.Column("rollback_requested", sa.Boolean(), nullable=False),
        sa.Column("lifecycle", sa.String(length=16), nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("job_generation", sa.Integer(), nullable=True),
        sa.Column("deployed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stable_generation", sa.Integer(), nullable=True),
        sa.Column("rollback_point", sa.Text(), nullable=True),
        sa.Column("last_savepoint", sa.Text(), nullable=True),
        sa.Column("last_periodic_savepoint_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("blocked_generation", sa.Integer(), nullable=True),
        sa.Column("pending", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "deployment_generations",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", "generation"),
    )
    op.create_table(
        "deployment_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("savepoint", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_deployment_events_name", "deployment_events", ["name"])
    op.create_table(
        "deployment_savepoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("disposed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_deployment_savepoints_name", "deployment_savepoints", ["name"])
    op.add_column("jobs", sa.Column("deployment", sa.String(length=63), nullable=True))
    op.create_index("ix_jobs_deployment", "jobs", ["deployment"])


def downgrade() -> None:
    op.drop_index("ix_jobs_deployment", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:  # SQLite drops a column by copying the table
        batch.drop_column("deployment")
    op.drop_index("ix_deployment_savepoints_name", table_name="deployment_savepoints")
    op.drop_table("deployment_savepoints")
    op.drop_index("ix_deployment_events_name", table_name="deployment_events")
    op.drop_table("deployment_events")
    op.drop_table("deployment_generations")
    op.drop_table("deployments")
