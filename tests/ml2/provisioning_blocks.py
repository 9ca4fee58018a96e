"""Neutron's provisioning blocks of one port, read and written in its database directly:
how a test plays another component's completion without Neutron announcing anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from podwire.stack.mariadb import MariaDB


class ProvisioningBlocks:
    def __init__(self, stack: dict[str, Any], port_id: str) -> None:
        self._engine = sa.create_engine(MariaDB(Path(stack["data_dir"])).url)
        with self._engine.connect() as conn:
            self._attr = conn.execute(
                sa.text("SELECT standard_attr_id FROM ports WHERE id = :id"), {"id": port_id}
            ).scalar_one()

    def entities(self) -> list[str]:
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT entity FROM provisioningblocks WHERE standard_attr_id = :a"),
                {"a": self._attr},
            )
            return sorted(row[0] for row in rows)

    def add(self, entity: str) -> None:
        self._write(
            "INSERT INTO provisioningblocks (standard_attr_id, entity) VALUES (:a, :e)", entity
        )

    def remove(self, entity: str) -> None:
        self._write(
            "DELETE FROM provisioningblocks WHERE standard_attr_id = :a AND entity = :e", entity
        )

    def _write(self, statement: str, entity: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(sa.text(statement), {"a": self._attr, "e": entity})

    def close(self) -> None:
        self._engine.dispose()
