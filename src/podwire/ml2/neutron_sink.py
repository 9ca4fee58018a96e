"""Feedback's actions on Neutron: provisioning completion and DOWN, inside neutron-server.

Each action re-reads the port first: the state key may be stale (the port moved or was
deleted while the agent was wiring it), and completing a block for the wrong host would show
ACTIVE for a port nobody wired.
"""

from __future__ import annotations

from typing import Any

from neutron.db import provisioning_blocks
from neutron_lib import constants
from neutron_lib import context as n_context
from neutron_lib import exceptions as n_exc
from neutron_lib.api.definitions import portbindings
from neutron_lib.callbacks import resources
from neutron_lib.plugins import directory
from oslo_db import exception as db_exc

from podwire.errors import RetryableError
from podwire.schema.ports import PODWIRE_VIF_TYPES


class NeutronPortStatus:
    """``PortStatusSink`` on the ML2 plugin loaded in this process."""

    def _port(self, context: Any, port_id: str) -> dict[str, Any] | None:
        try:
            port: dict[str, Any] = directory.get_plugin().get_port(context, port_id)
        except n_exc.PortNotFound:
            return None
        return port

    @staticmethod
    def _bound_here(port: dict[str, Any] | None, host: str) -> bool:
        return (
            port is not None
            and port.get(portbindings.HOST_ID) == host
            and port.get(portbindings.VIF_TYPE) in PODWIRE_VIF_TYPES
        )

    def port_wired(self, host: str, port_id: str) -> bool:
        return self._complete(host, port_id, only_down=False)

    def port_settled(self, host: str, port_id: str) -> bool:
        """Completing again is safe: with no block left Neutron announces the port ACTIVE
        (its subscribers must be idempotent), with one left it waits for its owner."""
        return self._complete(host, port_id, only_down=True)

    def _complete(self, host: str, port_id: str, only_down: bool) -> bool:
        context = n_context.get_admin_context()
        try:
            port = self._port(context, port_id)
            if port is None or not self._bound_here(port, host):
                return False
            if only_down and port["status"] != constants.PORT_STATUS_DOWN:
                return False
            provisioning_blocks.provisioning_complete(
                context, port_id, resources.PORT, provisioning_blocks.L2_AGENT_ENTITY
            )
        except (db_exc.DBError, n_exc.NeutronException) as exc:
            raise RetryableError(f"completing provisioning of port {port_id}: {exc}") from exc
        return True

    def port_unwired(self, host: str, port_id: str) -> bool:
        context = n_context.get_admin_context()
        try:
            port = self._port(context, port_id)
            if not self._bound_here(port, host) or port is None:
                return False
            if port["status"] == constants.PORT_STATUS_DOWN:
                return False
            directory.get_plugin().update_port_status(
                context, port_id, constants.PORT_STATUS_DOWN, host=host
            )
        except (db_exc.DBError, n_exc.NeutronException) as exc:
            raise RetryableError(f"setting port {port_id} DOWN: {exc}") from exc
        return True

    def host_down(self, host: str) -> int:
        context = n_context.get_admin_context()
        plugin = directory.get_plugin()
        try:
            ports = plugin.get_ports(
                context,
                filters={portbindings.HOST_ID: [host], "status": [constants.PORT_STATUS_ACTIVE]},
            )
            count = 0
            for port in ports:
                if port.get(portbindings.VIF_TYPE) in PODWIRE_VIF_TYPES:
                    plugin.update_port_status(
                        context, port["id"], constants.PORT_STATUS_DOWN, host=host
                    )
                    count += 1
        except (db_exc.DBError, n_exc.NeutronException) as exc:
            raise RetryableError(f"setting ports of host {host} DOWN: {exc}") from exc
        return count
