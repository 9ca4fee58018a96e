"""Journal values up to 16 MiB on MySQL/MariaDB (security groups with hundreds of rules).

Revision ID: podwire_0002
Revises: podwire_0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "podwire_0002"
down_revision = "podwire_0001"
branch_labels = None


def upgrade() -> None:
    op.alter_column(
        "podwire_journal",
        "value",
        existing_type=sa.Text(),
        type_=sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"),
        existing_nullable=True,
    )
