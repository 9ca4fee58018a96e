"""The apiserver away from the leader for 30 s while a burst of NetworkPolicy changes is made
through it (the kube stack's real apiserver, reached by the controller through the ``Relay``
of test_leader_kubernetes, which the test stops): the pools serve meanwhile, and once the
relay is back every change is in Neutron, none lost: policies deleted, changed and made, and
a relabelled pod's port moved to its new policies' groups."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS, group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import neutron_connection
from tests.controller.conftest import ScriptedNodes, make_network, release_vif, request_vif
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.k8s.test_leader_kubernetes import (  # noqa: F401  (the fixtures)
    Relay,
    Start,
    body,
    controller_url,
    group_ids,
    groups_of,
    kube_etcd,
    project,
    scripted,
    settings,
    start,
    uid_of,
)
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]

AWAY = 30.0  # seconds the apiserver is away from the controller
FIRST = 5  # policies before the outage
LAST = 15  # policies after the burst: p0 and p1 deleted, p2 changed, p5..p14 made


def policy(namespace: str, index: int, port: int | None = None) -> dict[str, Any]:
    """Ingress on one TCP port to the pods of tier t0 (even) or t1 (odd)."""
    return policy_manifest(
        namespace,
        f"p{index}",
        {
            "podSelector": {"matchLabels": {"tier": f"t{index % 2}"}},
            "ingress": [{"ports": [{"port": port or 7000 + index, "protocol": "TCP"}]}],
        },
    )


def expected(namespace: str, ports: dict[int, int]) -> dict[str, set[Any]]:
    """The policies' groups with their rules (policy index -> its port)."""
    return {
        group_name(ObjectKey(namespace, f"p{i}")): {("ingress", "tcp", port, port)}
        for i, port in ports.items()
    }


async def test_a_burst_of_policy_changes_while_the_apiserver_is_away_converges(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,  # noqa: F811
    project: str,  # noqa: F811
    start: Start,  # noqa: F811
    tmp_path: Path,
    caplog: Any,
) -> None:
    caplog.set_level(logging.INFO)
    relay = Relay(kube_stack["kube_apiserver"])
    await relay.start()
    kubeconfig = json.loads(Path(kube_stack["kubeconfig"]).read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    relayed = tmp_path / "relayed.kubeconfig"
    relayed.write_text(json.dumps(kubeconfig))

    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-burst", "10.89.0.0/24")
    controller = await start(settings(kube_stack, [node], project, relayed))
    tag = controller.settings.deployment.tag
    url = controller_url(controller)
    name = f"burst-{uuid.uuid4().hex[:8]}"

    async def neutron_holds(wanted: dict[str, set[Any]]) -> bool:
        found = await asyncio.to_thread(groups_of, neutron, project, tag)
        policies = {k: v for k, v in found.items() if k not in (OPEN_INGRESS, OPEN_EGRESS)}
        return policies == wanted

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"tier": "t0"}),
            *(policy(name, i) for i in range(FIRST)),
        )
        before = expected(name, {i: 7000 + i for i in range(FIRST)})
        await eventually(lambda: neutron_holds(before), "the first policies", timeout=60)
        async with aiohttp.ClientSession() as http:
            web = {
                "attachment": "w1:eth0",
                "network": network.id,
                "project_id": project,
                "security_groups": [],
                "pod": {"namespace": name, "name": "web", "uid": uid_of(kube_stack, name, "web")},
            }
            status, vif = await request_vif(http, url, node, web)
            assert status == 200, vif
            port_id = vif["vif"]["port_id"]

            await relay.stop()
            away_since = time.monotonic()
            # The burst, through the apiserver itself: 2 deleted, 1 changed, 10 made, the
            # pod relabelled from the even policies' tier to the odd ones'.
            kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "p0", "p1")
            await apply(
                kube_stack,
                tmp_path,
                policy(name, 2, port=7102),
                *(policy(name, i) for i in range(FIRST, LAST)),
            )
            done = kubectl(kube_stack, "label", "pod", "-n", name, "web", "tier=t1", "--overwrite")
            assert done.returncode == 0, done.stderr
            # The pools serve throughout: a request of no pod is answered, and released.
            while (left := AWAY - (time.monotonic() - away_since)) > 0:
                status, answer = await request_vif(http, url, node, body(network))
                assert status == 200, answer
                assert await release_vif(http, url, node, "k1:eth0") == 204
                await asyncio.sleep(min(left, 5.0))
            # Unseen by the controller, the changes are not in Neutron; nothing was undone.
            assert await neutron_holds(before)
            await relay.start()

            after = expected(name, {2: 7102} | {i: 7000 + i for i in range(3, LAST)})
            await eventually(lambda: neutron_holds(after), "every change of the burst", 90)
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            odd = {ids[group_name(ObjectKey(name, f"p{i}"))] for i in range(3, LAST, 2)}

            def moved() -> bool:
                port = neutron.network.get_port(port_id)
                return set(port.security_group_ids) == odd | {ids[OPEN_EGRESS]}

            await eventually(
                lambda: asyncio.to_thread(moved), "the relabelled pod's port moved", 60
            )
        lines = [r.getMessage() for r in caplog.records]
        assert lines.count("k8s.api.away") == 1 and lines.count("k8s.api.back") == 1
    finally:
        await relay.stop()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
