"""checks: CI checks, a plan judged against budgets

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27 01:20:00
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("baseline_plan_id", sa.Integer(), nullable=True),
        sa.Column("budgets", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["baseline_plan_id"], ["plans.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("checks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_checks_team_id"), ["team_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("checks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checks_team_id"))
    op.drop_table("checks")
