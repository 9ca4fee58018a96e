"""``interface_driver = podwire``: a veth pair per port of Neutron's DHCP or L3 agent.

The agent's end (``ns-…``, ``qr-…``, ``qg-…``) is in the agent's namespace with the port's MAC
and MTU; the host end ``tap<port id[:11]>`` is in the host's namespace, where podwire's node
agent adopts it like a VM's tap: onto the network's bridge with the port's rules in force. Both
ends are up at once: a tap on no bridge reaches nobody, and the node agent puts the rules in
force before it enslaves the tap, so no frame passes before them.

The driver runs inside the agent's (eventlet-patched) process, so the kernel work goes through
Neutron's own ``ip_lib`` and its privsep daemon, as Neutron's drivers do; the short waits are
``time.sleep``, which the patched process turns into a green yield.
"""

from __future__ import annotations

import time
from typing import Any

from neutron.agent.linux import interface, ip_lib
from neutron.agent.linux import utils as linux_utils
from neutron.privileged.agent.linux import ip_lib as priv_ip_lib

from podwire.errors import ForeignDevice, TapNotAdopted
from podwire.ifdriver import naming, options
from podwire.log import get_inline_logger
from podwire.schema.ports import tap_name

log = get_inline_logger(__name__)

POLL_INTERVAL = 0.1


class PodwireInterfaceDriver(interface.LinuxInterfaceDriver):  # type: ignore[misc]
    DEV_NAME_PREFIX = "ns-"

    def __init__(self, conf: Any, **kwargs: Any) -> None:
        super().__init__(conf, **kwargs)
        self.options = options.register(conf)
        self.host_netns: str | None = self.options.host_netns or None
        self.host = str(conf.host)

    @property
    def _where(self) -> str:
        return f"namespace {self.host_netns}" if self.host_netns else "the agent's namespace"

    def plug(
        self,
        network_id: str,
        port_id: str,
        device_name: str,
        mac_address: str,
        bridge: str | None = None,
        namespace: str | None = None,
        prefix: str | None = None,
        mtu: int | None = None,
    ) -> None:
        """A new pair, or the existing one (an agent restarted) repaired: MAC, MTU, up."""
        if not ip_lib.device_exists(device_name, namespace=namespace):
            self.plug_new(
                network_id, port_id, device_name, mac_address, bridge, namespace, prefix, mtu
            )
            return
        device = ip_lib.IPDevice(device_name, namespace=namespace)
        self._require_ours(device, port_id)
        tap = ip_lib.IPDevice(tap_name(port_id), namespace=self.host_netns)
        if (device.link.address or "").lower() != mac_address.lower():
            device.link.set_address(mac_address)
        for end in (device, tap):
            if mtu and end.link.mtu != mtu:
                end.link.set_mtu(mtu)
            end.link.set_up()
        log.info("ifdriver.repaired", port=port_id, device=device_name, namespace=namespace)

    def plug_new(
        self,
        network_id: str,
        port_id: str,
        device_name: str,
        mac_address: str,
        bridge: str | None = None,
        namespace: str | None = None,
        prefix: str | None = None,
        mtu: int | None = None,
    ) -> None:
        tap = tap_name(port_id)
        if ip_lib.device_exists(tap, namespace=self.host_netns):
            raise ForeignDevice(
                f"port {port_id}: {tap} already exists in {self._where} and is not the host"
                f" end of a pair of this driver; it is left alone and the port is not plugged"
            )
        host_end, agent_end = ip_lib.IPWrapper(namespace=self.host_netns).add_veth(
            tap, device_name, namespace2=namespace
        )
        try:
            agent_end.link.set_alias(naming.mark(self.host, port_id))
            agent_end.link.set_address(mac_address)
            if mtu:
                host_end.link.set_mtu(mtu)
                agent_end.link.set_mtu(mtu)
            agent_end.link.set_up()
            host_end.link.set_up()
            log.info("ifdriver.plugged", port=port_id, tap=tap, device=device_name, mtu=mtu)
            self._wait_adopted(port_id, tap)
        except Exception:
            if agent_end.exists():
                agent_end.link.delete()  # the tap goes with it
            log.warning("ifdriver.plug_undone", port=port_id, tap=tap, device=device_name)
            raise

    def unplug(
        self,
        device_name: str,
        bridge: str | None = None,
        namespace: str | None = None,
        prefix: str | None = None,
    ) -> None:
        """Remove the pair through its marked agent end; anything else is left alone."""
        device = ip_lib.IPDevice(device_name, namespace=namespace)
        if not device.exists():
            log.debug("ifdriver.unplug_absent", device=device_name, namespace=namespace)
            return
        port_id = naming.marked_port(device.link.alias, self.host)
        if port_id is None:
            log.warning(
                "ifdriver.foreign_left", device=device_name, namespace=namespace, host=self.host
            )
            return
        device.link.delete()
        log.info("ifdriver.unplugged", port=port_id, device=device_name, namespace=namespace)

    def set_mtu(
        self,
        device_name: str,
        mtu: int,
        namespace: str | None = None,
        prefix: str | None = None,
    ) -> None:
        device = ip_lib.IPDevice(device_name, namespace=namespace)
        port_id = naming.marked_port(device.link.alias, self.host)
        if port_id is None:
            log.warning("ifdriver.mtu_foreign", device=device_name, namespace=namespace)
            return
        device.link.set_mtu(mtu)
        tap = ip_lib.IPDevice(tap_name(port_id), namespace=self.host_netns)
        if tap.exists():
            tap.link.set_mtu(mtu)

    def _require_ours(self, device: Any, port_id: str) -> None:
        if naming.marked_port(device.link.alias, self.host) != port_id:
            raise ForeignDevice(
                f"port {port_id}: {device.name} exists in {device.namespace or 'the root'}"
                f" namespace but is not this driver's device for that port on host"
                f" {self.host}; it is left alone"
            )

    def _wait_adopted(self, port_id: str, tap: str) -> None:
        """Until podwire's node agent has the tap on a bridge: only then can the port serve."""
        timeout = float(self.options.adopt_timeout)
        if timeout <= 0:
            return
        deadline = time.monotonic() + timeout
        while not self._enslaved(tap):
            if time.monotonic() >= deadline:
                log.error("ifdriver.not_adopted", port=port_id, tap=tap, host=self.host)
                raise TapNotAdopted(
                    f"port {port_id}: podwire's node agent did not put {tap} ({self._where})"
                    f" on a bridge within {timeout:g} s, so the pair was removed. Is podwire's"
                    f" agent running for host {self.host}, and does it serve this network"
                    f" (its physical network or VXLAN) and VIF type tap? A port it cannot"
                    f" serve shows binding:vif_type binding_failed in Neutron."
                )
            time.sleep(POLL_INTERVAL)
        log.info("ifdriver.adopted", port=port_id, tap=tap)

    def _enslaved(self, tap: str) -> bool:
        for link in priv_ip_lib.get_link_devices(self.host_netns):
            if linux_utils.get_attr(link, "IFLA_IFNAME") == tap:
                return bool(linux_utils.get_attr(link, "IFLA_MASTER"))
        raise TapNotAdopted(f"{tap} disappeared from {self._where} before it was adopted")
