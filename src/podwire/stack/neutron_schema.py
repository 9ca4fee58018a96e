"""Create Neutron's tables (and podwire's) from the models, once per database.

``neutron-db-manage`` runs hundreds of migrations; the local stack only needs the final
schema, which ``metadata.create_all`` builds in a few seconds. Real deployments use the
migrations (and podwire's alembic branch).
"""

from __future__ import annotations

import sys

import sqlalchemy
from neutron.db.migration.models import head

import podwire.ml2.journal  # noqa: F401  (registers podwire's journal table in the metadata)


def create_schema(url: str) -> None:
    engine = sqlalchemy.create_engine(url)
    try:
        head.get_metadata().create_all(engine)
    finally:
        engine.dispose()


if __name__ == "__main__":
    create_schema(sys.argv[1])
