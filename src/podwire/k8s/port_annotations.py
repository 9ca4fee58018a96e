"""The annotations that show a pod its Neutron port: podwire's own (``podwire.io/...``) and
the ``k8s.v1.cni.cncf.io/network-status`` list the Network Plumbing Working Group's
multi-network specification defines, which tools that know Multus already read.

Values are built here from what the controller knows of a pod's ports, one interface each;
the first (``eth0`` when it has one) is the pod's default network."""

from __future__ import annotations

import json
from dataclasses import dataclass

PORT_ID = "podwire.io/port-id"
MAC = "podwire.io/mac"
ADDRESSES = "podwire.io/addresses"
NETWORK = "podwire.io/network"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
KEYS = (PORT_ID, MAC, ADDRESSES, NETWORK, NETWORK_STATUS)
# The name network-status gives the default network: the CNI network name `podwire cni
# install` writes into its conflist unless told otherwise.
DEFAULT_NETWORK_NAME = "podwire"
DEFAULT_INTERFACE = "eth0"


@dataclass(frozen=True)
class ShownPort:
    port_id: str
    mac: str
    addresses: tuple[str, ...]
    network_id: str
    interface: str = DEFAULT_INTERFACE


def port_annotations(ports: list[ShownPort]) -> dict[str, str]:
    """The annotations for a pod's ports (at least one), as strings the API stores."""
    ordered = sorted(ports, key=lambda p: (p.interface != DEFAULT_INTERFACE, p.interface))
    first = ordered[0]
    status = [
        {
            "name": DEFAULT_NETWORK_NAME if index == 0 else f"{DEFAULT_NETWORK_NAME}-{p.interface}",
            "interface": p.interface,
            "ips": list(p.addresses),
            "mac": p.mac,
            "default": index == 0,
            "dns": {},
        }
        for index, p in enumerate(ordered)
    ]
    return {
        PORT_ID: first.port_id,
        MAC: first.mac,
        ADDRESSES: json.dumps(list(first.addresses)),
        NETWORK: first.network_id,
        NETWORK_STATUS: json.dumps(status),
    }
