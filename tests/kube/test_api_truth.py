"""The Kubernetes API as the truth, on a real kubelet: a pod shows its Neutron port in its
annotations, and a pod force-deleted while its node's agent is down has its port released
by the controller (nothing on the node could); the agent, back, lets kubelet finish the
sandbox's teardown and nothing is left.

The controller (``[kubernetes]``) and the agent run as processes (``podwire.demo.services``);
kubelet is the real one of a kube-node."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from podwire.agent import naming
from podwire.demo.services import Services
from podwire.k8s.port_annotations import ADDRESSES, NETWORK, NETWORK_STATUS, PORT_ID
from tests.agent.netenv import links_in
from tests.kube.conftest import Cluster
from tests.kube.test_pool import NodeAgent
from tests.scripted_agent import eventually

pytestmark = [pytest.mark.stack, pytest.mark.netns, pytest.mark.slow]

HOST_INDEX = 15


async def _port_of_ip(cluster: Cluster, address: str) -> Any:
    ports = await asyncio.to_thread(cluster.ports)
    found = [p for p in ports if any(ip["ip_address"] == address for ip in p.fixed_ips)]
    assert len(found) == 1, f"{len(found)} ports with {address}"
    return found[0]


async def test_a_pod_shows_its_port_and_one_deleted_while_its_agent_is_down_releases_it(
    cluster: Cluster,
) -> None:
    netns, vtep = cluster.netenv.host(cluster.address_base + HOST_INDEX)
    host = cluster.host_name(HOST_INDEX)
    project = cluster.network.project_id
    services = Services(cluster.work / "api-truth", cluster.info["etcd"], cluster.info["neutron"])
    services.work.mkdir()
    kubernetes = f'[kubernetes]\nkubeconfig = "{cluster.info["kubeconfig"]}"\n'
    kubernetes += f'project_id = "{project}"\n'
    kubernetes += "gone_pod_grace = 2.0\n"  # the force-deleted pod's agent is down: no DEL
    node = None
    try:
        await asyncio.to_thread(services.start_controller, [host], kubernetes)
        socket = await asyncio.to_thread(services.start_agent, host, netns, vtep)
        node = await cluster.start_node(NodeAgent(host, netns, socket))  # type: ignore[arg-type]
        await cluster.create_pod("truth-a", host)
        running = await cluster.running("truth-a", 120)
        port = await _port_of_ip(cluster, running["status"]["podIP"])

        async def shown() -> dict[str, str] | None:
            pod = await cluster.kubectl.get("pod", "-n", cluster.namespace, "truth-a")
            found = (pod or {}).get("metadata", {}).get("annotations") or {}
            return found if PORT_ID in found else None

        annotations = await eventually(shown, "truth-a's annotations", 60)
        assert annotations[PORT_ID] == port.id
        assert annotations[NETWORK] == cluster.network.id
        assert json.loads(annotations[ADDRESSES]) == [running["status"]["podIP"]]
        status = json.loads(annotations[NETWORK_STATUS])
        assert [(s["interface"], s["mac"], s["default"]) for s in status] == [
            ("eth0", port.mac_address, True)
        ]

        # The agent down: no DEL can reach anything. The API says the pod is gone.
        await asyncio.to_thread(services.stop_child, host)
        await cluster.delete_pod("truth-a", "--grace-period=0", "--force")
        await cluster.gone("truth-a")

        async def released() -> bool:
            ports = await asyncio.to_thread(cluster.ports)
            return port.id not in {p.id for p in ports}

        await eventually(released, "the force-deleted pod's port deleted in Neutron", 60)
        assert not [k for k in await cluster.port_keys(host) if k.startswith("/podwire/vifs/")]

        # Back, the agent unwires what its desired keys no longer name, and kubelet's DEL
        # finds nothing left to release.
        await asyncio.to_thread(services.start_agent, host, netns, vtep)

        async def unwired() -> bool:
            return not {name for name in links_in(netns) if naming.is_pod_veth(name)}

        await eventually(unwired, "the pod's veth gone from the host", 180)
    finally:
        if node is not None:
            assert await cluster.retire(node) == 0
        await cluster.delete_pod("truth-a", "--grace-period=0", "--force", "--ignore-not-found")
        if services.children.get("controller"):
            await asyncio.to_thread(services.admin, "POST", "/v1/pools/free", {"nodes": [host]})
        await asyncio.to_thread(services.stop)
