"""CNI results in the shape each supported version expects, chained onto ``prevResult``.

The agent keeps one version-neutral ``Attached`` per attachment (in its checkpoint) and renders
it for whatever ``cniVersion`` the runtime's config asks for, so a repeated ADD returns the
same result and CHECK can compare against it.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from podwire.schema.checkpoints import Address, Attached


def render(attached: Attached, version: str, prev: dict[str, Any] | None) -> dict[str, Any]:
    """Our interfaces, IPs and routes (each subnet's gateway as the default route, then its host
    routes) appended to ``prev`` (chaining), in ``version``'s shape."""
    result = copy.deepcopy(prev) if prev else {}
    result["cniVersion"] = version
    interfaces = result.setdefault("interfaces", [])
    offset = len(interfaces)
    interfaces.extend(_interfaces(attached, version))
    ips = result.setdefault("ips", [])
    routes = result.setdefault("routes", [])
    for item in attached.addresses:
        ips.append(_ip(item, offset + 1, version))
        if item.gateway:
            default = "::/0" if ipaddress.ip_address(item.gateway).version == 6 else "0.0.0.0/0"
            routes.append({"dst": default, "gw": item.gateway})
        routes.extend({"dst": r.destination, "gw": r.nexthop} for r in item.routes)
    result.setdefault("dns", {})
    return result


def _interfaces(attached: Attached, version: str) -> list[dict[str, Any]]:
    host: dict[str, Any] = {"name": attached.host_ifname, "mac": attached.host_mac}
    pod: dict[str, Any] = {
        "name": attached.ifname,
        "mac": attached.mac,
        "sandbox": attached.sandbox,
    }
    if version == "1.1.0":
        host["mtu"] = attached.mtu
        pod["mtu"] = attached.mtu
    return [host, pod]


def _ip(item: Address, index: int, version: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"address": item.address, "interface": index}
    if item.gateway:
        entry["gateway"] = item.gateway
    if version == "0.4.0":
        entry["version"] = str(ipaddress.ip_interface(item.address).version)
    return entry


def add_memif(
    result: dict[str, Any], name: str, mac: str, socket_path: str, addresses: tuple[Address, ...]
) -> dict[str, Any]:
    """List a memif interface (no sandbox: it is a socket, not a netdev) and its IPs. CNI 1.1
    has ``socketPath`` for such interfaces; older results carry it too (readers ignore it)."""
    interfaces = result.setdefault("interfaces", [])
    interfaces.append({"name": name, "mac": mac, "socketPath": socket_path})
    index = len(interfaces) - 1
    version = result.get("cniVersion", "")
    ips = result.setdefault("ips", [])
    for item in addresses:
        entry: dict[str, Any] = {"address": item.address, "interface": index}
        if version == "0.4.0":
            entry["version"] = str(ipaddress.ip_interface(item.address).version)
        ips.append(entry)
    return result
