"""Helpers for the ml2 tests: a scripted agent that writes state keys like a real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podwire.ml2.journal import SqlJournal
from podwire.stack.mariadb import MariaDB


@pytest.fixture(scope="session")
def journal(stack: dict[str, Any]) -> SqlJournal:
    return SqlJournal(MariaDB(Path(stack["data_dir"])).url)


def port_binding(neutron: Any, port_id: str) -> tuple[str, str, str]:
    port = neutron.network.get_port(port_id)
    return port.binding_host_id, port.binding_vif_type, port.status


async def status_is(neutron: Any, port_id: str, status: str) -> bool:
    return bool(port_binding(neutron, port_id)[2] == status)
