"""Bad input through both plugin builds: the right CNI code, nothing half-created, still serving."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire.cni import spec
from tests.agent.harness import HostAgent, acni, cni
from tests.agent.netenv import NetEnv, in_ns, links_in

pytestmark = pytest.mark.stack

CID = "c0ffee"


def _env_cases(pod: str) -> list[tuple[str, dict[str, str], int]]:
    return [
        ("no command", {"CNI_COMMAND": ""}, spec.INVALID_ENV),
        ("unknown command", {"CNI_COMMAND": "EXPLODE"}, spec.INVALID_ENV),
        ("no container id", {"CNI_CONTAINERID": ""}, spec.INVALID_ENV),
        ("bad container id", {"CNI_CONTAINERID": "../etc"}, spec.INVALID_ENV),
        ("no netns", {"CNI_NETNS": ""}, spec.INVALID_ENV),
        ("netns missing", {"CNI_NETNS": "/run/netns/pwt-does-not-exist"}, spec.INVALID_ENV),
        ("netns not a netns", {"CNI_NETNS": "/etc/hostname"}, spec.INVALID_ENV),
        ("relative netns", {"CNI_NETNS": "run/netns/x"}, spec.INVALID_ENV),
        ("ifname too long", {"CNI_IFNAME": "a" * 16}, spec.INVALID_ENV),
        ("ifname with slash", {"CNI_IFNAME": "et/h0"}, spec.INVALID_ENV),
        ("junk CNI_ARGS", {"CNI_ARGS": "IgnoreUnknown=1;garbage"}, spec.INVALID_ENV),
        ("junk pod name", {"CNI_ARGS": "K8S_POD_NAME=a b"}, spec.INVALID_ENV),
        # "$" in a pattern accepts a trailing newline; every name is matched in full.
        ("container id + newline", {"CNI_CONTAINERID": "abc\n"}, spec.INVALID_ENV),
        ("ifname + newline", {"CNI_IFNAME": "eth0\n"}, spec.INVALID_ENV),
        ("pod name + newline", {"CNI_ARGS": "K8S_POD_NAME=p\n"}, spec.INVALID_ENV),
    ]


async def test_bad_env_and_config_get_spec_codes_and_create_nothing(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, neutron: Any, project_id: str
) -> None:
    agent = agents[0]
    pod = netenv.namespace("pod")
    good = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": CID,
        "CNI_NETNS": f"/run/netns/{pod}",
        "CNI_IFNAME": "eth0",
    }
    conf = agent.conf(vxnet.id)
    hosts = [
        ("the host's netns", {"CNI_NETNS": f"/run/netns/{agent.netns}"}, spec.INVALID_ENV),
        ("the agent's own netns", {"CNI_NETNS": "/proc/self/ns/net"}, spec.INVALID_ENV),
    ]
    for what, override, code in _env_cases(pod) + hosts:
        call = await acni(plugin, "ADD", conf, extra_env={**good, **override})
        assert call.code == code, (what, call.stdout)
        error = call.json
        assert error["code"] == code and error["msg"], what
        if "netns" in what and what.startswith("the "):
            assert "the host's own network namespace" in error["msg"], error

    config_cases = [
        ("not json", "{oops", spec.DECODE_FAILURE),
        ("not an object", "[1]", spec.DECODE_FAILURE),
        ("deeply nested", '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}", spec.DECODE_FAILURE),
        ("network + newline", json.dumps({**conf, "network": "net\n"}), spec.INVALID_CONFIG),
        ("old version", json.dumps({**conf, "cniVersion": "0.3.1"}), spec.INCOMPATIBLE_VERSION),
        ("no network", json.dumps({**conf, "network": ""}), spec.INVALID_CONFIG),
        ("bad sg", json.dumps({**conf, "securityGroups": "x"}), spec.INVALID_CONFIG),
        ("unknown network", json.dumps({**conf, "network": f"nope-{uuid.uuid4().hex}"}), 7),
    ]
    for what, stdin, code in config_cases:
        env = {**good, "PODWIRE_CNI_SOCKET": agent.socket}
        call = await acni(plugin, "ADD", stdin, extra_env=env)
        assert call.code == code, (what, call.stdout)
        if what == "unknown network":
            assert "does not exist" in call.json["msg"]

    assert links_in(pod) == ["lo"]
    assert not [n for n in links_in(agent.netns) if n.startswith("pwp")]
    assert list(neutron.network.ports(project_id=project_id)) == [
        p
        for p in neutron.network.ports(project_id=project_id)
        if p.device_owner != "compute:podwire"
    ]
    status = await acni(
        plugin, "STATUS", {"cniVersion": "1.1.0", "name": "n", "agentSocket": agent.socket}
    )
    assert status.code == 0, status.stdout


def _raw_exchange(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return sock.makefile("rb").read()


async def test_garbage_on_the_socket_gets_a_decode_error(agents: list[HostAgent]) -> None:
    agent = agents[0]
    for garbage in (b"hello", b"[]", b'{"env": 5}', b"\xff\xfe", b"[" * 100_000):
        reply = await asyncio.to_thread(_raw_exchange, agent.socket, garbage)
        head, _, body = reply.partition(b"\n")
        assert int(head) == spec.DECODE_FAILURE, garbage
        assert json.loads(body)["code"] == spec.DECODE_FAILURE
    assert oct(Path(agent.socket).stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("kind", ["c", "python"])
def test_unreachable_agent_and_version(kind: str, tmp_path: Path) -> None:
    from tests.agent.harness import plugin_binary

    binary = plugin_binary(kind, tmp_path)
    conf = {"cniVersion": "1.1.0", "name": "n", "network": "x", "agentSocket": str(tmp_path / "no")}
    version = cni(binary, "VERSION", "")
    assert version.code == 0 and "1.1.0" in version.json["supportedVersions"]
    status = cni(binary, "STATUS", conf)
    assert status.code == spec.NOT_AVAILABLE and status.json["code"] == spec.NOT_AVAILABLE
    add = cni(binary, "ADD", conf, container_id="c1", netns="/run/netns/x")
    assert add.code == spec.TRY_AGAIN and "not reachable" in add.json["msg"]


async def test_an_interface_name_taken_in_the_pod_is_a_clear_permanent_error(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, neutron: Any, project_id: str
) -> None:
    """Not code 11 naming the host veth: code 4 naming the clash; nothing is left (the port
    goes back, no veth), and the same ADD with a free name then works."""
    agent = agents[0]
    pod = netenv.namespace("taken")
    in_ns(pod, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
    call = await acni(plugin, "ADD", agent.conf(vxnet.id), container_id=CID,
                      netns=f"/run/netns/{pod}")  # fmt: skip
    assert call.code == spec.INVALID_ENV, call.stdout
    message = call.json["msg"]
    assert "CNI_IFNAME eth0" in message and f"/run/netns/{pod}" in message, message
    assert not [n for n in links_in(agent.netns) if n.startswith("pwp")]
    ports = list(neutron.network.ports(project_id=project_id, device_owner="compute:podwire"))
    assert [p for p in ports if p.binding_host_id == agent.host and p.device_id] == []
    again = await acni(plugin, "ADD", agent.conf(vxnet.id), container_id=CID,
                       netns=f"/run/netns/{pod}", ifname="eth1")  # fmt: skip
    assert again.code == 0, again.stdout
