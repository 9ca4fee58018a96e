"""``scripts/demo``: the local stack doing real work, shown step by step.

Starts etcd + MariaDB + Neutron, creates a VXLAN network with a subnet, creates pod ports in
one bulk call bound to a host, lists them back through the same filters the controller uses,
and tears everything down again (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from podwire.stack.client import neutron_connection, start_background, stop_background

HOST = "demo-node-1"


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def create_ports(neutron: Any, project: str, count: int) -> tuple[Any, list[Any], float]:
    network = neutron.network.create_network(name="demo-pods", project_id=project)
    neutron.network.create_subnet(
        network_id=network.id, cidr="10.77.0.0/24", ip_version=4, project_id=project
    )
    started = time.monotonic()
    bodies = [
        {
            "network_id": network.id,
            "project_id": project,
            "device_owner": "compute:podwire",
            "binding_host_id": HOST,
            "name": f"demo-pod-{index}",
        }
        for index in range(count)
    ]
    ports = list(neutron.network.create_ports(bodies))
    return network, ports, time.monotonic() - started


def print_ports(ports: list[Any]) -> None:
    print(f"    {'port':36}  {'name':12}  {'mac':17}  {'ip':12}  host         vif")
    for port in ports:
        ip = port.fixed_ips[0]["ip_address"] if port.fixed_ips else "-"
        print(
            f"    {port.id:36}  {port.name:12}  {port.mac_address:17}  {ip:12}"
            f"  {port.binding_host_id:11}  {port.binding_vif_type}"
        )


def run(data_dir: Path, count: int, keep: bool) -> int:
    step(f"starting etcd + MariaDB + Neutron in {data_dir}")
    proc, info = start_background(data_dir)
    try:
        ready = info["ready_seconds"]
        step(f"stack ready in {ready} s: neutron {info['neutron']}, etcd {info['etcd']}")
        neutron = neutron_connection(info["neutron"])
        project = uuid.uuid4().hex
        network, _, seconds = create_ports(neutron, project, count)
        step(
            f"network {network.id} ({network.provider_network_type}, VNI"
            f" {network.provider_segmentation_id}, MTU {network.mtu});"
            f" {count} ports in one bulk call: {seconds * 1000:.0f} ms"
        )
        listed = list(
            neutron.network.ports(
                project_id=project, device_owner="compute:podwire", **{"binding:host_id": HOST}
            )
        )
        print_ports(sorted(listed, key=lambda port: port.name))
        if keep:
            step(f"left running; stop with: podwire stack down --data-dir {data_dir}")
            return 0
        for port in listed:
            neutron.network.delete_port(port)
        neutron.network.delete_network(network)
        step(f"deleted {len(listed)} ports and the network")
    except BaseException:
        stop_background(proc)
        raise
    if not keep:
        stop_background(proc)
        step("stack stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument("--ports", type=int, default=5, choices=range(1, 51), metavar="1..50")
    parser.add_argument("--data-dir", type=Path, help="default: a fresh temporary dir")
    args = parser.parse_args(argv)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="podwire-demo-", dir="/tmp"))
    code = run(data_dir, args.ports, args.keep)
    if not args.keep and args.data_dir is None:
        shutil.rmtree(data_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
