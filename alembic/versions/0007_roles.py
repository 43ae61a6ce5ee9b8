"""roles: service administrators, authors of models and clusters, worker restarts

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 03:00:00

A database of an earlier revision had one kind of administrator, who could act in every
team; from here team admins act in their own team and service admins everywhere. The
oldest admin (the first admin `shardlab serve` made) becomes the service admin.
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("is_service_admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    users = sa.table(
        "users", sa.column("id", sa.Integer), sa.column("is_admin", sa.Boolean),
        sa.column("is_service_admin", sa.Boolean),
    )  # fmt: skip
    first_admin = (
        sa.select(sa.func.min(users.c.id)).where(users.c.is_admin.is_(True)).scalar_subquery()
    )
    op.execute(users.update().where(users.c.id == first_admin).values(is_service_admin=True))
    for table in ("models", "clusters"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("author_id", sa.Integer(), nullable=True))
            batch_op.create_foreign_key(
                f"fk_{table}_author_id_users", "users", ["author_id"], ["id"], ondelete="SET NULL"
            )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("restarts")
    for table in ("clusters", "models"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"fk_{table}_author_id_users", type_="foreignkey")
            batch_op.drop_column("author_id")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("is_service_admin")
