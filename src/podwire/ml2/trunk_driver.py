"""Trunk driver: makes Neutron's trunk plugin load, and binds subports where the parent is.

With no agent in the loop (``agent_type=None``) Neutron leaves subports unbound and trunks
DOWN; podwire's agents learn about subports only through their desired keys, which exist only
for bound ports. So the driver copies the parent's host onto each subport (marking it
``trunk:subport`` so it is wired as a veth with the parent's VLAN id) and sets the trunk ACTIVE
— only for trunks whose parent podwire bound: another driver's trunk (OVS, OVN) is left to it.
A subport detached from such a trunk is released: unbound (its desired key goes from the node)
and owned as ``compute:podwire`` again, so the controller's sweeper deletes it if nobody holds
it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neutron.objects import trunk as trunk_objects
from neutron.services.trunk.drivers import base as trunk_base
from neutron_lib import exceptions as n_exc
from neutron_lib.api.definitions import portbindings
from neutron_lib.callbacks import events, registry, resources
from neutron_lib.plugins import directory
from neutron_lib.services.trunk import constants as trunk_consts

from podwire.log import get_inline_logger
from podwire.schema.ports import PODWIRE_VIF_TYPES
from podwire.schema.vif import DEVICE_OWNER

log = get_inline_logger(__name__)

DRIVER_NAME = "podwire"
TRUNK_VIF_TYPES = ("veth", "tap", "vhostuser")


@registry.has_registry_receivers
class PodwireTrunkDriver(trunk_base.DriverBase):  # type: ignore[misc]
    @property
    def is_loaded(self) -> bool:
        return True

    @classmethod
    def create(cls) -> PodwireTrunkDriver:
        return cls(
            DRIVER_NAME,
            TRUNK_VIF_TYPES,
            ("vlan",),
            agent_type=None,
            can_trunk_bound_port=True,
        )

    @registry.receives(resources.TRUNK_PLUGIN, [events.AFTER_INIT])  # type: ignore[untyped-decorator]
    def register(self, resource: Any, event: Any, trigger: Any, payload: Any = None) -> None:
        super().register(resource, event, trigger, payload=payload)
        registry.subscribe(self._trunk_created, resources.TRUNK, events.AFTER_CREATE)
        registry.subscribe(self._subports_added, resources.SUBPORTS, events.AFTER_CREATE)
        registry.subscribe(self._subports_removed, resources.SUBPORTS, events.AFTER_DELETE)
        registry.subscribe(self._port_updated, resources.PORT, events.AFTER_UPDATE)

    def _trunk_created(self, resource: Any, event: Any, trigger: Any, payload: Any) -> None:
        trunk = payload.states[0]
        self._follow_parent(payload.context, trunk, trunk.sub_ports)

    def _subports_added(self, resource: Any, event: Any, trigger: Any, payload: Any) -> None:
        trunk = payload.states[-1]
        self._follow_parent(payload.context, trunk, payload.metadata.get("subports", []))

    def _port_updated(self, resource: Any, event: Any, trigger: Any, payload: Any) -> None:
        original, port = payload.states[0], payload.states[-1]
        if original.get(portbindings.HOST_ID) == port.get(portbindings.HOST_ID):
            return
        trunk = trunk_objects.Trunk.get_object(payload.context, port_id=port["id"])
        if trunk is not None:
            self._follow_parent(payload.context, trunk, trunk.sub_ports)

    def _subports_removed(self, resource: Any, event: Any, trigger: Any, payload: Any) -> None:
        plugin = directory.get_plugin()
        self._release(payload.context, plugin, payload.metadata.get("subports", []))

    def _follow_parent(self, context: Any, trunk: Any, subports: Iterable[Any]) -> None:
        plugin = directory.get_plugin()
        parent = plugin.get_port(context, trunk.port_id)
        host = parent.get(portbindings.HOST_ID) or ""
        if not host:  # the parent left its host: the subports podwire bound leave it too
            self._release(context, plugin, subports, owner=trunk_consts.TRUNK_SUBPORT_OWNER)
            self._set_status(trunk, trunk_consts.TRUNK_DOWN_STATUS)
            return
        if parent.get(portbindings.VIF_TYPE) not in PODWIRE_VIF_TYPES:
            log.info("ml2.trunk.not_ours", trunk=trunk.id, parent=trunk.port_id, host=host)
            return
        for subport in subports:
            body = {portbindings.HOST_ID: host, "device_owner": trunk_consts.TRUNK_SUBPORT_OWNER}
            plugin.update_port(context, subport.port_id, {"port": body})
            log.info("ml2.trunk.subport_host", trunk=trunk.id, port=subport.port_id, host=host)
        self._set_status(trunk, trunk_consts.TRUNK_ACTIVE_STATUS)

    @staticmethod
    def _set_status(trunk: Any, status: str) -> None:
        if trunk.status != status:
            trunk.update(status=status)

    @staticmethod
    def _release(
        context: Any, plugin: Any, subports: Iterable[Any], owner: str = DEVICE_OWNER
    ) -> None:
        """Unbind the subports podwire bound (as ``trunk:subport`` with one of its vif
        types); ``owner`` is what they are owned as afterwards."""
        for subport in subports:
            try:
                port = plugin.get_port(context, subport.port_id)
            except n_exc.PortNotFound:
                continue
            ours = port.get(portbindings.VIF_TYPE) in PODWIRE_VIF_TYPES
            if not ours or port.get("device_owner") != trunk_consts.TRUNK_SUBPORT_OWNER:
                continue
            body = {portbindings.HOST_ID: "", "device_owner": owner}
            plugin.update_port(context, subport.port_id, {"port": body})
            log.info("ml2.trunk.subport_released", port=subport.port_id, owner=owner)
