"""Create the podwire journal table.

Revision ID: podwire_0001
Revises: None
"""

import sqlalchemy as sa
from alembic import op

revision = "podwire_0001"
down_revision = None
branch_labels = ("podwire",)


def upgrade() -> None:
    op.create_table(
        "podwire_journal",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        mysql_engine="InnoDB",
    )
