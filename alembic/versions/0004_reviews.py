"""reviews: review requests, comments, history, baselines; plan authors and review state;
checks that verify

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27 02:40:00
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "baselines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=100), nullable=False),
        sa.Column("set_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["set_by"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team_id", "name"),
    )
    with op.batch_alter_table("baselines", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_baselines_team_id"), ["team_id"], unique=False)

    op.create_table(
        "review_comments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("thread_id", sa.Integer(), nullable=True),
        sa.Column("author_id", sa.Integer(), nullable=True),
        sa.Column("anchor", sa.JSON(), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["author_id"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["resolved_by"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["thread_id"], ["review_comments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("review_comments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_review_comments_plan_id"), ["plan_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_review_comments_team_id"), ["team_id"], unique=False)

    op.create_table(
        "review_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=30), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["actor_id"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("review_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_review_events_plan_id"), ["plan_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_review_events_team_id"), ["team_id"], unique=False)

    op.create_table(
        "review_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("reviewer_id", sa.Integer(), nullable=False),
        sa.Column("requested_by", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["requested_by"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["reviewer_id"], ["users.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("plan_id", "reviewer_id"),
    )
    with op.batch_alter_table("review_requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_review_requests_plan_id"), ["plan_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_review_requests_reviewer_id"), ["reviewer_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_review_requests_team_id"), ["team_id"], unique=False)

    with op.batch_alter_table("checks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("verification_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_checks_verification_id_verifications",
            "verifications",
            ["verification_id"],
            ["id"],
            ondelete="SET NULL",
        )

    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("author_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("review_state", sa.String(length=20), nullable=False, server_default="none")
        )
        batch_op.create_index(batch_op.f("ix_plans_review_state"), ["review_state"], unique=False)
        batch_op.create_foreign_key(
            "fk_plans_author_id_users", "users", ["author_id"], ["id"], ondelete="SET NULL"
        )


def downgrade() -> None:
    with op.batch_alter_table("checks", schema=None) as batch_op:
        batch_op.drop_constraint("fk_checks_verification_id_verifications", type_="foreignkey")
        batch_op.drop_column("verification_id")

    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_constraint("fk_plans_author_id_users", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_plans_review_state"))
        batch_op.drop_column("review_state")
        batch_op.drop_column("author_id")

    with op.batch_alter_table("review_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_review_requests_team_id"))
        batch_op.drop_index(batch_op.f("ix_review_requests_reviewer_id"))
        batch_op.drop_index(batch_op.f("ix_review_requests_plan_id"))

    op.drop_table("review_requests")
    with op.batch_alter_table("review_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_review_events_team_id"))
        batch_op.drop_index(batch_op.f("ix_review_events_plan_id"))

    op.drop_table("review_events")
    with op.batch_alter_table("review_comments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_review_comments_team_id"))
        batch_op.drop_index(batch_op.f("ix_review_comments_plan_id"))

    op.drop_table("review_comments")
    with op.batch_alter_table("baselines", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_baselines_team_id"))

    op.drop_table("baselines")
