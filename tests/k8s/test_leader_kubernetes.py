"""The leader controller with ``[kubernetes]`` against the real kube-apiserver and Neutron of
``podwire stack up --kubernetes``: a policy made with kubectl is enforced by the running
controller; an apiserver that cannot be reached at start, or goes away later (a TCP relay the
test stops), is one log line naming the server, readiness and metrics say so, the pools keep
serving, and everything converges once it answers again."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from podwire.config import EtcdSettings, KubernetesSettings, Settings
from podwire.controller.app import NETPOL_NAME_PREFIX, Controller
from podwire.controller.leader import ELECTION
from podwire.etcd.client import EtcdClient
from podwire.k8s.groups import OPEN_EGRESS, OPEN_INGRESS, group_name
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import connect, neutron_connection
from podwire.neutron.netpol import NetpolObjects
from tests.controller.conftest import (
    Node,
    ScriptedNodes,
    make_network,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)
from tests.k8s.objects import namespace_manifest, policy_manifest
from tests.k8s.test_apiserver import apply, pod
from tests.scripted_agent import eventually
from tests.stack.conftest import kubectl

pytestmark = [pytest.mark.stack, pytest.mark.slow]


class Relay:
    """A TCP relay to the apiserver on a port of its own: stopped, connections to it are
    refused and the open ones cut (an apiserver gone); started again on the same port."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 443)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


@pytest.fixture
async def kube_etcd(kube_stack: dict[str, Any]) -> AsyncIterator[EtcdClient]:
    client = await EtcdClient.connect(EtcdSettings(endpoints=[kube_stack["etcd"]]))
    yield client
    await client.close()


@pytest.fixture
async def scripted(kube_etcd: EtcdClient) -> AsyncIterator[ScriptedNodes]:
    made = ScriptedNodes(kube_etcd)
    yield made
    await made.cleanup()


@pytest.fixture
def project(kube_stack: dict[str, Any]) -> Any:
    """A project of this test's own in the kube stack's Neutron: its ports, networks and the
    reconciler's groups go afterwards."""
    project_id = uuid.uuid4().hex
    neutron = neutron_connection(kube_stack["neutron"])
    yield project_id
    net = neutron.network
    for port in list(net.ports(project_id=project_id)):
        net.delete_port(port)
    for network in list(net.networks(project_id=project_id)):
        net.delete_network(network)
    for group in list(net.security_groups(project_id=project_id)):
        net.delete_security_group(group)
    for address_group in list(net.address_groups(project_id=project_id)):
        net.delete_address_group(address_group)


Start = Callable[[Settings], Awaitable[Controller]]


async def lead(config: Settings, etcd: EtcdClient) -> tuple[Controller, asyncio.Task[None]]:
    """A controller once it serves (it leads), with its task: the caller ends it, so a test
    can stop a controller and start another."""
    controller = Controller(config, etcd, connect(config.neutron))
    task = asyncio.create_task(controller.run())

    async def serving() -> bool:
        if task.done():
            task.result()
        return controller.service.serving  # type: ignore[no-any-return]

    try:
        await eventually(serving, "controller serving", timeout=60)
    except BaseException:
        task.cancel()
        raise
    return controller, task


@pytest.fixture
async def start(kube_etcd: EtcdClient) -> AsyncIterator[Start]:
    tasks: list[asyncio.Task[None]] = []

    async def run(settings: Settings) -> Controller:
        controller, task = await lead(settings, kube_etcd)
        tasks.append(task)
        controller.term.join()
        return controller

    yield run
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await kube_etcd.delete(ELECTION)


def settings(
    kube_stack: dict[str, Any], nodes: list[Node], project: str, kubeconfig: Path | str
) -> Settings:
    base = settings_for(kube_stack, nodes)
    return replace(
        base, kubernetes=KubernetesSettings(kubeconfig=str(kubeconfig), project_id=project)
    )


def deny_all_but_dns(namespace: str) -> dict[str, Any]:
    return policy_manifest(
        namespace,
        "dns",
        {"podSelector": {}, "ingress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]},
    )


def groups_of(neutron: Any, project: str, deployment_tag: str) -> dict[str, set[Any]]:
    objects = NetpolObjects(neutron, project, deployment_tag, NETPOL_NAME_PREFIX)
    return {
        g.name: {(r.direction, r.protocol, r.port_min, r.port_max) for r in g.rules}
        for g in objects.groups()
    }


async def readyz(http: aiohttp.ClientSession, controller: Controller) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{controller.port}/readyz") as response:
        return response.status, await response.text()


async def metric(http: aiohttp.ClientSession, controller: Controller, name: str) -> float | None:
    async with http.get(f"http://127.0.0.1:{controller.port}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_running_leader_enforces_a_policy_made_with_kubectl(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,
    project: str,
    start: Start,
    tmp_path: Path,
) -> None:
    node = await scripted.add()
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    tag = controller.settings.deployment.tag
    neutron = neutron_connection(kube_stack["neutron"])
    name = f"np-{uuid.uuid4().hex[:8]}"
    group = group_name(ObjectKey(name, "dns"))
    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            deny_all_but_dns(name),
        )

        async def enforced() -> bool:
            found = await asyncio.to_thread(groups_of, neutron, project, tag)
            return found.get(group) == {("ingress", "udp", 53, 53)}

        await eventually(enforced, "the policy's group with its one rule", timeout=30)
        async with aiohttp.ClientSession() as http:
            status, text = await readyz(http, controller)
            assert status == 200 and "kubernetes" not in text, text
            assert await metric(http, controller, "podwire_kubernetes_api_up") == 1.0

            async def synced() -> bool:
                ok = await metric(http, controller, 'podwire_netpol_syncs_total{result="ok"}')
                return ok is not None and ok >= 1

            # The group is there during the pass that makes it; the pass is counted after.
            await eventually(synced, "a pass counted")

        kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "dns")

        async def gone() -> bool:
            return group not in await asyncio.to_thread(groups_of, neutron, project, tag)

        await eventually(gone, "the policy's group deleted", timeout=30)
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def test_an_apiserver_away_at_start_and_later_leaves_the_pools_serving_and_converges(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,
    project: str,
    start: Start,
    tmp_path: Path,
    caplog: Any,
) -> None:
    """The kubeconfig names a relay that is not started: the controller serves pools, says
    once that the apiserver is away and names it in readiness and metrics; the relay started,
    the policy made meanwhile is enforced; the relay stopped again, a policy deleted and
    another made while it is down are caught up once it is back (the watch resumes)."""
    caplog.set_level(logging.INFO)
    relay = Relay(kube_stack["kube_apiserver"])
    kubeconfig = json.loads(Path(kube_stack["kubeconfig"]).read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    relayed = tmp_path / "relayed.kubeconfig"
    relayed.write_text(json.dumps(kubeconfig))
    server = f"https://127.0.0.1:{relay.port}"

    node = await scripted.add()
    network = make_network(
        neutron_connection(kube_stack["neutron"]), project, "pw-k8s", "10.78.0.0/24"
    )
    controller = await start(settings(kube_stack, [node], project, relayed))
    tag = controller.settings.deployment.tag
    neutron = neutron_connection(kube_stack["neutron"])
    name = f"np-{uuid.uuid4().hex[:8]}"
    first, second = group_name(ObjectKey(name, "dns")), group_name(ObjectKey(name, "web"))
    try:
        async with aiohttp.ClientSession() as http:
            # Away from the start: the pools serve anyway (an attachment of no pod); a pod's
            # port waits for what the API says of it (its namespace's network is decided
            # first), then is refused as retryable, naming the apiserver (kubelet asks again).
            status, vif = await request_vif(http, controller_url(controller), node, body(network))
            assert status == 200, vif
            assert await release_vif(http, controller_url(controller), node, "k1:eth0") == 204
            status, refused = await request_vif(
                http, controller_url(controller), node, vif_body("k2:eth0", network)
            )
            assert (status, refused["cause"], refused["retryable"]) == (
                503,
                "namespace_network",
                True,
            ), refused
            assert f"not answering: {server}" in refused["error"], refused

            async def says_away() -> bool:
                code, text = await readyz(http, controller)
                return code == 200 and f"kubernetes: {server}" in text

            await eventually(says_away, "readiness naming the apiserver", timeout=30)
            assert await metric(http, controller, "podwire_kubernetes_api_up") == 0.0
            errors = await metric(http, controller, "podwire_kubernetes_api_errors_total")
            assert errors is not None and errors >= 1
            away = [r for r in caplog.records if r.getMessage() == "k8s.api.away"]
            assert len(away) == 1 and away[0].fields["server"] == server  # type: ignore[attr-defined]
            assert "Connect" in away[0].fields["error"]  # type: ignore[attr-defined]

            await apply(
                kube_stack,
                tmp_path,
                namespace_manifest(name),
                deny_all_but_dns(name),
                pod(name, "web", {"app": "web"}),
            )
            await relay.start()

            async def has(
                wanted: AbstractSet[str], unwanted: AbstractSet[str] = frozenset()
            ) -> bool:
                found = await asyncio.to_thread(groups_of, neutron, project, tag)
                return wanted <= set(found) and not unwanted & set(found)

            await eventually(lambda: has({first}), "the policy made while away", timeout=60)
            await eventually(
                lambda: _in_step(http, controller), "readiness without kubernetes", timeout=30
            )
            assert [r.getMessage() for r in caplog.records].count("k8s.api.back") == 1

            # Away again, later: the pools still serve, a known pod's port is decided from the
            # cache (its groups as last seen); changes meanwhile are caught up.
            await relay.stop()
            status, vif = await request_vif(http, controller_url(controller), node, body(network))
            assert status == 200, vif
            web_ref = vif_body("k3:eth0", network)
            web_ref["pod"] = {"namespace": name, "name": "web", "uid": ""}
            status, vif = await request_vif(http, controller_url(controller), node, web_ref)
            assert status == 200, vif
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            assert ids[first] in vif["vif"]["security_groups"], vif
            # Its port is deleted in Neutron: moving it is skipped, and the group can go.
            neutron.network.delete_port(vif["vif"]["port_id"])
            kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "dns")
            web = deny_all_but_dns(name)
            web["metadata"]["name"] = "web"
            await apply(kube_stack, tmp_path, web)
            await eventually(says_away, "readiness naming the apiserver again", timeout=30)
            await relay.start()
            await eventually(
                lambda: has({second}, {first}), "the changes made while away", timeout=60
            )
            await eventually(
                lambda: _in_step(http, controller), "readiness without kubernetes", timeout=30
            )
            lines = [r.getMessage() for r in caplog.records]
            assert lines.count("k8s.api.away") == 2 and lines.count("k8s.api.back") == 2
            assert controller.kubernetes is not None
            assert controller.kubernetes.watcher is not None
            # The watch resumed from its version: nothing was listed again.
            informers = controller.kubernetes.watcher.informers
            assert [i.lists for i in informers] == [1] * len(informers)
    finally:
        await relay.stop()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


def controller_url(controller: Controller) -> str:
    return f"http://127.0.0.1:{controller.port}"


def body(network: Any) -> dict[str, Any]:
    """A request of no pod (a VM's, an attachment made without Kubernetes)."""
    request = vif_body("k1:eth0", network)
    del request["pod"]
    return request


def group_ids(neutron: Any, project: str, deployment_tag: str) -> dict[str, str]:
    objects = NetpolObjects(neutron, project, deployment_tag, NETPOL_NAME_PREFIX)
    return {g.name: g.id for g in objects.groups()}


def uid_of(kube_stack: dict[str, Any], namespace: str, name: str) -> str:
    done = kubectl(kube_stack, "get", "pod", "-n", namespace, name, "-o=jsonpath={.metadata.uid}")
    assert done.returncode == 0 and done.stdout, done.stderr
    return done.stdout


async def test_a_pods_port_carries_its_policies_groups_decided_before_it_is_handed_out(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,
    project: str,
    start: Start,
    tmp_path: Path,
) -> None:
    """Through the VIF API, as an agent's ADD asks: a pod a policy selects for ingress gets
    that policy's group and the open egress group, an unselected pod both open groups, and
    the port in Neutron carries exactly those; a policy made just before a new pod's request
    is in that pod's port (the request waits for its group); a pod the API does not know is
    refused as retryable, naming it; a policy deleted while a port carries its group leaves
    the port, then Neutron."""
    node = await scripted.add()
    neutron = neutron_connection(kube_stack["neutron"])
    network = make_network(neutron, project, "pw-k8s", "10.79.0.0/24")
    controller = await start(settings(kube_stack, [node], project, kube_stack["kubeconfig"]))
    tag = controller.settings.deployment.tag
    url = controller_url(controller)
    name = f"np-{uuid.uuid4().hex[:8]}"
    web_in = policy_manifest(
        name,
        "web-in",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}]}],
        },
    )

    def ref(pod_name: str, attachment: str) -> dict[str, Any]:
        request = vif_body(attachment, network)
        uid = uid_of(kube_stack, name, pod_name)
        request["pod"] = {"namespace": name, "name": pod_name, "uid": uid}
        return request

    try:
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            pod(name, "web", {"app": "web"}),
            pod(name, "db", {"app": "db"}),
            web_in,
        )
        async with aiohttp.ClientSession() as http:
            status, web = await request_vif(http, url, node, ref("web", "w1:eth0"))
            assert status == 200, web
            status, db = await request_vif(http, url, node, ref("db", "d1:eth0"))
            assert status == 200, db
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            policy = ids[group_name(ObjectKey(name, "web-in"))]
            assert web["vif"]["security_groups"] == sorted([policy, ids[OPEN_EGRESS]])
            assert db["vif"]["security_groups"] == sorted([ids[OPEN_INGRESS], ids[OPEN_EGRESS]])
            for answer in (web, db):
                port = neutron.network.get_port(answer["vif"]["port_id"])
                assert sorted(port.security_group_ids) == answer["vif"]["security_groups"]

            # A pod made as soon as the controller knows a new policy, before the policy's
            # group is in Neutron: its request waits for the group. (A policy without
            # policyTypes and with egress rules isolates both ways: its group alone.)
            db_out = copy.deepcopy(web_in)
            db_out["metadata"]["name"] = "db-out"
            db_out["spec"] = {"podSelector": {"matchLabels": {"app": "db"}}, "egress": [{}]}
            await apply(kube_stack, tmp_path, db_out)
            watcher = controller.kubernetes.watcher if controller.kubernetes else None
            assert watcher is not None

            async def known() -> bool:
                return ObjectKey(name, "db-out") in watcher.policies.objects

            await eventually(known, "the new policy in the controller's cache")
            await apply(kube_stack, tmp_path, pod(name, "db2", {"app": "db"}))
            status, db2 = await request_vif(http, url, node, ref("db2", "d2:eth0"))
            assert status == 200, db2
            ids = await asyncio.to_thread(group_ids, neutron, project, tag)
            assert db2["vif"]["security_groups"] == [ids[group_name(ObjectKey(name, "db-out"))]]

            unknown = vif_body("u1:eth0", network)
            unknown["pod"] = {"namespace": name, "name": "nobody", "uid": str(uuid.uuid4())}
            status, refused = await request_vif(http, url, node, unknown)
            assert (status, refused["cause"]) == (503, "policy_not_ready"), refused
            assert f"pod {name}/nobody" in refused["error"], refused
            assert "no such pod" in refused["error"], refused

            # A policy deleted while a port carries its group: the port moves to the open
            # groups, then the group goes (tests/k8s/test_ports_follow.py has the rest); the
            # passes go on: a policy made afterwards is enforced.
            kubectl(kube_stack, "delete", "networkpolicy", "-n", name, "web-in")
            late = copy.deepcopy(db_out)
            late["metadata"]["name"] = "late"
            await apply(kube_stack, tmp_path, late)
            late_group = group_name(ObjectKey(name, "late"))

            async def late_there() -> bool:
                found = await asyncio.to_thread(group_ids, neutron, project, tag)
                return late_group in found and group_name(ObjectKey(name, "web-in")) not in found

            await eventually(late_there, "a policy made after one deleted", timeout=30)
            port = neutron.network.get_port(web["vif"]["port_id"])
            assert sorted(port.security_group_ids) == sorted([ids[OPEN_INGRESS], ids[OPEN_EGRESS]])
    finally:
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")


async def _in_step(http: aiohttp.ClientSession, controller: Controller) -> bool:
    code, text = await readyz(http, controller)
    return code == 200 and "kubernetes" not in text


async def test_only_the_leader_reads_the_api_and_its_successor_takes_over(
    kube_stack: dict[str, Any],
    scripted: ScriptedNodes,
    project: str,
    tmp_path: Path,
) -> None:
    """Two controllers with ``[kubernetes]``: the one not leading opens no watch (every
    follower watching the whole cluster is the load informers exist to avoid), and once the
    leader goes its successor lists, watches and enforces a policy made after."""
    node = await scripted.add()
    config = settings(kube_stack, [node], project, kube_stack["kubeconfig"])
    clients = [await EtcdClient.connect(EtcdSettings(endpoints=[kube_stack["etcd"]])) for _ in "ab"]
    controllers = [Controller(config, client, connect(config.neutron)) for client in clients]
    tasks = [asyncio.create_task(c.run()) for c in controllers]
    neutron = neutron_connection(kube_stack["neutron"])
    name = f"succ-{uuid.uuid4().hex[:8]}"

    async def leading() -> Controller | None:
        for task in tasks:
            if task.done() and not task.cancelled():
                task.result()
        return next((c for c in controllers if c.service.serving), None)

    try:
        leader = await eventually(leading, "a leader", 60)
        follower = next(c for c in controllers if c is not leader)

        async def reading(controller: Controller) -> bool:
            side = controller.kubernetes
            return side is not None and side.watcher is not None and side.synced

        await eventually(lambda: reading(leader), "the leader reading the API", 30)
        await asyncio.sleep(2)  # a follower that watched would have listed by now
        assert not follower.service.serving
        assert follower.kubernetes is not None and follower.kubernetes.watcher is None

        tasks[controllers.index(leader)].cancel()
        await eventually(lambda: reading(follower), "the successor leading and reading the API", 60)
        await apply(
            kube_stack,
            tmp_path,
            namespace_manifest(name),
            deny_all_but_dns(name),
        )
        group, tag = group_name(ObjectKey(name, "dns")), config.deployment.tag

        async def enforced() -> bool:
            found = await asyncio.to_thread(groups_of, neutron, project, tag)
            return found.get(group) == {("ingress", "udp", 53, 53)}

        await eventually(enforced, "the policy enforced by the successor", 60)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await clients[0].delete(ELECTION)
        for client in clients:
            await client.close()
        kubectl(kube_stack, "delete", "namespace", name, "--wait=false")
