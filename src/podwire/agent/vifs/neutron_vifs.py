"""The ``vif_source = "neutron"`` source: a Neutron port per attachment, made and deleted by
the agent.

Slow (a port create is ~100 ms plus binding) but needs nothing besides Neutron; the port's
name carries the attachment so a retried ADD finds the port an interrupted one created.
"""

from __future__ import annotations

import asyncio
from typing import Any

from podwire.errors import PermanentError, RetryableError, ValidationError
from podwire.log import get_logger
from podwire.neutron.client import NeutronClient, NeutronNotFound, NeutronRequestError
from podwire.neutron.vifs import NetworkInfo, port_to_vif
from podwire.schema import fields
from podwire.schema.vif import DEVICE_OWNER, Vif, VifRequest

log = get_logger(__name__)


class UnknownNetworkError(PermanentError):
    """The CNI config names a network Neutron does not know (for this project)."""


class NetworkWithoutSubnetError(PermanentError):
    """The CNI config's network has no subnet: a pod would get a port without any address."""


class NeutronVifSource:
    def __init__(self, client: NeutronClient, host: str, tag: str) -> None:
        """``tag``: the deployment's, carried by every port this source creates."""
        self._client = client
        self._host = host
        self._tag = tag
        self._networks: dict[tuple[str, str | None], Any] = {}

    @staticmethod
    def port_name(attachment: str) -> str:
        return f"podwire-{attachment}"

    async def request(self, req: VifRequest, deadline: float) -> Vif:
        network = await self._network(req.network, req.project_id)
        subnets = await asyncio.to_thread(self._client.list_subnets, network_id=network.id)
        if not subnets:  # refused before a port exists: nothing to release afterwards
            named = f"network {req.network!r}"
            if req.network != network.id:
                named += f" ({network.id})"
            raise NetworkWithoutSubnetError(
                f"{named} has no subnet, so a pod would get no address: add a subnet in Neutron"
                " or fix 'network' in the CNI network config"
            )
        port = await self._existing(req.attachment)
        if port is not None and str(port.id) == req.replaces:  # unbound: not ours to wire now
            await asyncio.to_thread(self._client.delete_port, str(port.id))
            port = None
        if port is None:
            port = await self._create(req, network)
        return port_to_vif(port, NetworkInfo.from_neutron(network, subnets))

    async def _network(self, name_or_id: str, project_id: str | None) -> Any:
        key = (name_or_id, project_id)
        if key not in self._networks:
            found = await asyncio.to_thread(self._client.find_network, name_or_id, project_id)
            if found is None:
                scope = f" in project {project_id}" if project_id else ""
                raise UnknownNetworkError(
                    f"network {name_or_id!r} does not exist{scope}: fix 'network' (or"
                    " 'project') in the CNI network config"
                )
            self._networks[key] = found
        return self._networks[key]

    async def _existing(self, attachment: str) -> Any | None:
        ports = await asyncio.to_thread(
            self._client.list_ports, name=self.port_name(attachment), device_owner=DEVICE_OWNER
        )
        return ports[0] if ports else None

    async def _create(self, req: VifRequest, network: Any) -> Any:
        body: dict[str, Any] = {
            "name": self.port_name(req.attachment),
            "network_id": network.id,
            "project_id": req.project_id or network.project_id,
            "device_owner": DEVICE_OWNER,
            "device_id": req.pod.uid if req.pod and req.pod.uid else req.attachment,
            "binding_host_id": self._host,
        }
        if req.security_groups:
            body["security_group_ids"] = list(req.security_groups)
        try:
            (port,) = await asyncio.to_thread(self._client.create_ports, [body], self._tag)
        except NeutronNotFound as exc:
            raise UnknownNetworkError(f"{exc}: check 'securityGroups' in the CNI config") from exc
        except NeutronRequestError as exc:
            raise PermanentError(f"Neutron refused the port: {exc}") from exc
        log.info("agent.vif.created", attachment=req.attachment, port=port.id)
        return port

    async def release(self, attachment: str, vif: Any) -> None:
        if vif is not None:
            await asyncio.to_thread(self._client.delete_port, vif.port_id)
            return
        for port_id, held in await self._held_ports():
            if held == attachment:
                await asyncio.to_thread(self._client.delete_port, port_id)

    async def held(self) -> set[str]:
        return {attachment for _, attachment in await self._held_ports()}

    async def _held_ports(self) -> list[tuple[str, str]]:
        """(port id, canonical attachment) of this host's ports; names from before the
        ``<container>:<ifname>`` ids read as the canonical id, so GC never mistakes a running
        pod's older port for an orphan."""
        ports = await asyncio.to_thread(
            self._client.list_ports, device_owner=DEVICE_OWNER, **{"binding:host_id": self._host}
        )
        prefix = self.port_name("")
        found = []
        for port in ports:
            name = str(port.name or "")
            if not name.startswith(prefix):
                continue
            try:
                found.append((str(port.id), fields.attachment(name.removeprefix(prefix), name)))
            except ValidationError:
                log.info("agent.vif.unknown_port_name", port=port.id, name=name[:300])
        return found

    async def healthy(self) -> tuple[bool, str]:
        try:
            await asyncio.to_thread(self._client.list_networks, limit=1)
        except RetryableError as exc:
            return False, f"neutron: {exc}"
        return True, "neutron reachable"
