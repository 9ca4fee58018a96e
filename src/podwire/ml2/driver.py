"""The ``podwire`` ML2 mechanism driver as loaded by neutron-server.

This first version binds any flat, vlan or vxlan segment for vnic type ``normal`` and makes the
trunk plugin loadable; host liveness checks, the journal and feedback come with the ml2 work.
"""

from __future__ import annotations

from typing import Any

from neutron_lib.api.definitions import portbindings
from neutron_lib.plugins.ml2 import api

from podwire.ml2.trunk_driver import PodwireTrunkDriver

SUPPORTED_NETWORK_TYPES = ("flat", "vlan", "vxlan")
INFRA_OWNER_PREFIXES = ("network:", "neutron:")


def vif_type_for(device_owner: str) -> str:
    """Infrastructure ports are taps; everything else is wired as a veth for now."""
    if device_owner.startswith(INFRA_OWNER_PREFIXES):
        return "tap"
    return "veth"


class PodwireMechanismDriver(api.MechanismDriver):  # type: ignore[misc]
    def initialize(self) -> None:
        self.trunk_driver = PodwireTrunkDriver.create()

    @property
    def connectivity(self) -> str:
        return str(portbindings.CONNECTIVITY_L2)

    def bind_port(self, context: Any) -> None:
        vnic_type = context.current.get(portbindings.VNIC_TYPE, portbindings.VNIC_NORMAL)
        if vnic_type != portbindings.VNIC_NORMAL:
            return
        for segment in context.segments_to_bind:
            if segment[api.NETWORK_TYPE] in SUPPORTED_NETWORK_TYPES:
                vif_type = vif_type_for(context.current.get("device_owner") or "")
                context.set_binding(segment[api.ID], vif_type, {})
                return
