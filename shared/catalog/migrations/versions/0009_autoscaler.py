"""autoscaler: a deployment's effective parallelism and what the autoscaler remembers, and the
record of its evaluations

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("parallelism", sa.Integer(), nullable=True))
    op.add_column("deployments", sa.Column("scaled_from", sa.Integer(), nullable=True))
    op.add_column("deployments", sa.Column("scaled_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("deployments", sa.Column("autoscaler_hold", sa.Text(), nullable=True))
    op.add_column("deployments", sa.Column("autoscaler_held_generation", sa.Integer(), nullable=True))
    op.add_column("deployments", sa.Column("fixed_cost_s", sa.Float(), nullable=True))
    op.create_table(
        "autoscaler_evaluations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("parallelism", sa.Integer(), nullable=False),
        sa.Column("proposed", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_autoscaler_evaluations_name", "autoscaler_evaluations", ["name"])


def downgrade() -> None:
    op.drop_index("ix_autoscaler_evaluations_name", table_name="autoscaler_evaluations")
    op.drop_table("autoscaler_evaluations")
    for column in (
        "fixed_cost_s",
        "autoscaler_held_generation",
        "autoscaler_hold",
        "scaled_at",
        "scaled_from",
        "parallelism",
    ):
        op.drop_column("deployments", column)
