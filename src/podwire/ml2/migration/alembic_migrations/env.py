"""Alembic environment run by neutron-db-manage for the podwire subproject."""

from alembic import context
from neutron.db.migration.connection import DBConnection

VERSION_TABLE = "alembic_version_podwire"


def run_online() -> None:
    neutron_config = context.config.neutron_config
    connection = context.config.attributes.get("connection")
    with DBConnection(neutron_config.database.connection, connection) as conn:
        context.configure(connection=conn, version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()


def run_offline() -> None:
    neutron_config = context.config.neutron_config
    context.configure(url=neutron_config.database.connection, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
