"""Unit tests without namespaces: request parsing, result rendering, nested mode, VIF client."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from pyroute2.netlink.exceptions import NetlinkError

from podwire.agent.cni.request import PodRef, parse_args, parse_request
from podwire.agent.cni.result import render
from podwire.agent.vifs.controller_vifs import (
    ControllerRefused,
    ControllerUnavailable,
    ControllerVifSource,
)
from podwire.cni import spec
from podwire.cni.spec import CniError
from podwire.errors import ConfigError, ValidationError
from podwire.netlink import links
from podwire.schema.checkpoints import Address, Attached
from podwire.schema.ports import parse_desired_port as parse_desired
from podwire.schema.vif import VifRequest

VIF = {
    "v": 1,
    "port_id": "11111111-2222-3333-4444-555555555555",
    "network_id": "66666666-2222-3333-4444-555555555555",
    "project_id": "0123456789abcdef0123456789abcdef",
    "mac_address": "fa:16:3e:00:00:01",
    "mtu": 1450,
    "fixed_ips": [
        {
            "ip_address": "10.0.0.5",
            "subnet_id": "s",
            "cidr": "10.0.0.0/24",
            "gateway_ip": "10.0.0.1",
        }
    ],
    "vlan_id": 101,
}
ATTACHED = Attached(
    "pwpabc",
    "aa:bb:cc:dd:ee:ff",
    "eth0",
    "fa:16:3e:00:00:01",
    1450,
    "/run/netns/x",
    (Address("10.0.0.5/24", "10.0.0.1"),),
)


def test_render_versions_and_chaining() -> None:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo0"}],
        "ips": [],
        "dns": {"nameservers": ["1.1.1.1"]},
    }
    out = render(ATTACHED, "1.0.0", prev)
    assert out["ips"] == [{"address": "10.0.0.5/24", "gateway": "10.0.0.1", "interface": 2}]
    assert out["dns"] == {"nameservers": ["1.1.1.1"]} and "mtu" not in out["interfaces"][2]
    assert render(ATTACHED, "0.4.0", None)["ips"][0]["version"] == "4"
    assert render(ATTACHED, "1.1.0", None)["interfaces"][1]["mtu"] == 1450
    assert prev["interfaces"] == [{"name": "lo0"}]  # the runtime's object is not modified


SG = "5e3ad7a8-9a1b-4c2d-8e3f-0123456789ab"


def test_request_parsing() -> None:
    conf = json.dumps(
        {"cniVersion": "1.1.0", "name": "n", "network": "net", "securityGroups": [SG]}
    )
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc",
        "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u-1",
    }
    req = parse_request(env, conf)
    assert req.attachment == "abc:eth0" and req.pod == PodRef("ns", "p", "u-1")
    deleted = parse_request({**env, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}, conf)
    assert deleted.netns == ""
    with pytest.raises(CniError) as exc:
        parse_request({**env, "CNI_COMMAND": "GC"}, conf.replace("1.1.0", "1.0.0"))
    assert exc.value.code == spec.INCOMPATIBLE_VERSION
    assert parse_args("") == {}
    with pytest.raises(CniError, match="not KEY=VALUE"):
        parse_args("a=b;;=c")


PORT = "11111111-2222-3333-4444-555555555555"


def test_desired_values_are_validated() -> None:
    good = {
        "v": 1,
        "port_id": PORT,
        "network_id": "66666666-2222-3333-4444-555555555555",
        "mac_address": "FA:16:3E:00:00:01",
        "mtu": 1450,
        "network_type": "vxlan",
        "vif_type": "veth",
        "segmentation_id": 7,
        "fixed_ips": [],
        "extra": "ignored",
    }
    assert parse_desired(json.dumps(good).encode(), PORT).mac_address == "fa:16:3e:00:00:01"
    for change, message in (
        ({"port_id": "11111111-2222-3333-4444-000000000000"}, "does not match"),
        ({"segmentation_id": None}, "needs a segmentation_id"),
        ({"network_type": "geneve"}, "not one of"),
        ({"mtu": 20}, "mtu"),
        ({"v": 2}, "schema"),
    ):
        with pytest.raises(ValidationError, match=message):
            parse_desired(json.dumps({**good, **change}).encode(), PORT)


class RecordingIpr:
    """Stands in for IPRoute in nested-mode tests: records link requests."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def link(self, verb: str, **kw: Any) -> list[Any]:
        self.calls.append((verb, kw))
        if verb == "get":
            if kw["ifname"] != "ens3":
                raise NetlinkError(errno.ENODEV, "no such device")
            return [
                {
                    "index": 7,
                    "ifname": "ens3",
                    "flags": 1,
                    "mtu": 1500,
                    "address": "x",
                    "master": 0,
                    "linkinfo": None,
                }
            ]
        return []


def test_nested_mode_creates_vlan_subinterface_inside_the_pod() -> None:
    ipr = RecordingIpr()
    links.add_vlan(ipr, "eth0", "ens3", 101, "fa:16:3e:00:00:01", 1450, netns_fd=42)
    verb, args = ipr.calls[-1]
    assert verb == "add"
    assert args == {
        "ifname": "eth0",
        "kind": "vlan",
        "link": 7,
        "vlan_id": 101,
        "address": "fa:16:3e:00:00:01",
        "mtu": 1450,
        "net_ns_fd": 42,
    }
    with pytest.raises(NetlinkError):
        links.add_vlan(ipr, "eth0", "missing", 101, "fa:16:3e:00:00:01", 1450, netns_fd=42)


# -- controller VIF source against a stub of the VIF API ---------------------------------


@pytest.fixture
async def stub() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"busy": 1, "deleted": [], "auth": []}

    async def post(request: web.Request) -> web.Response:
        state["auth"].append(request.headers.get("Authorization"))
        body = await request.json()
        if body["network"] == "missing":
            return web.json_response({"error": "network missing not found"}, status=404)
        if request.match_info["node"] != "node-1":
            return web.json_response({"error": "token of another node"}, status=403)
        if state["busy"]:
            state["busy"] -= 1
            return web.json_response(
                {"error": "no port", "retryable": True}, status=503, headers={"Retry-After": "0"}
            )
        return web.json_response({"vif": VIF})

    async def delete(request: web.Request) -> web.Response:
        state["deleted"].append(request.match_info["attachment"])
        return web.Response(status=204)

    async def listing(_: web.Request) -> web.Response:
        return web.json_response({"attachments": {"c:eth0": VIF}})

    app = web.Application()
    app.router.add_post("/v1/nodes/{node}/vifs", post)
    app.router.add_delete("/v1/nodes/{node}/vifs/{attachment}", delete)
    app.router.add_get("/v1/nodes/{node}/vifs", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


def _req(network: str = "net") -> VifRequest:
    return VifRequest("c:eth0", network, None, (SG,), PodRef("ns", "p", "u"))


async def test_controller_source_retries_503_then_returns_the_vif(
    stub: tuple[str, dict[str, Any]],
) -> None:
    url, state = stub
    source = ControllerVifSource(url, "node-1", "tok", retry_delay=0.01)
    try:
        deadline = asyncio.get_running_loop().time() + 5
        vif = await source.request(_req(), deadline)
        assert vif.port_id == VIF["port_id"] and vif.vlan_id == 101
        assert state["auth"] == ["Bearer tok", "Bearer tok"]
        await source.release("c:eth0", vif)
        assert state["deleted"] == ["c:eth0"]
        assert await source.healthy() == (True, "controller reachable")
    finally:
        await source.close()


async def test_controller_source_errors(stub: tuple[str, dict[str, Any]]) -> None:
    url, state = stub
    source = ControllerVifSource(url, "node-1", "tok", retry_delay=0.01)
    other = ControllerVifSource(url, "node-2", "tok")
    dead = ControllerVifSource("http://127.0.0.1:9", "node-1", "tok")
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(ControllerRefused, match="network missing not found"):
            await source.request(_req("missing"), loop.time() + 5)
        with pytest.raises(ConfigError, match=r"agent\.token"):
            await other.request(_req(), loop.time() + 5)
        state["busy"] = 100
        with pytest.raises(ControllerUnavailable, match="503"):
            await source.request(_req(), loop.time() + 0.05)
        with pytest.raises(ControllerUnavailable):
            await dead.request(_req(), loop.time())
        assert (await dead.healthy())[0] is False
    finally:
        for item in (source, other, dead):
            await item.close()


async def test_controller_source_fails_over_to_the_other_controller(
    stub: tuple[str, dict[str, Any]],
) -> None:
    """A dead first endpoint (or a standby's 503) sends the agent to the next one."""
    url, state = stub
    state["busy"] = 0
    source = ControllerVifSource(f"http://127.0.0.1:9,{url}", "node-1", "tok", retry_delay=0.01)
    try:
        vif = await source.request(_req(), asyncio.get_running_loop().time() + 5)
        assert vif.port_id == VIF["port_id"]
        assert list(await source.attachments()) == ["c:eth0"]  # stays on the live endpoint
        await source.release("c:eth0", vif)
        assert state["deleted"] == ["c:eth0"]
    finally:
        await source.close()


def test_checkpoint_survives_reload(tmp_path: Any) -> None:
    from podwire.agent.ports.checkpoint import attachments
    from podwire.schema.checkpoints import Attachment
    from podwire.schema.vif import Vif

    store = attachments(str(tmp_path))
    entry = Attachment(
        "c:eth0", "c", "eth0", "n", "/run/netns/x", None, Vif.from_json(VIF), ATTACHED
    )
    asyncio.run(store.put(entry))
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"
    again = attachments(str(tmp_path))
    again.load()
    assert again.get("c:eth0") == entry
    store.path.write_text("{broken")
    with pytest.raises(ConfigError, match="damaged"):
        attachments(str(tmp_path)).load()


def args_of(tmp_path: Any) -> list[str]:
    return [
        "cni",
        "install",
        "--bin-dir",
        str(tmp_path / "bin"),
        "--conf-dir",
        str(tmp_path / "conf"),
    ]


def test_cni_install_writes_binary_and_conflist(tmp_path: Any) -> None:
    import argparse

    from podwire.cli import cni_cmd

    parser = argparse.ArgumentParser()
    cni_cmd.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "cni",
            "install",
            "--bin-dir",
            str(tmp_path / "bin"),
            "--conf-dir",
            str(tmp_path / "conf"),
            "--network",
            "pods",
            "--chain",
            "portmap",
        ]
    )
    assert args.handler(args) == 0
    assert os.access(tmp_path / "bin" / "podwire", os.X_OK)
    conf = json.loads((tmp_path / "conf" / "10-podwire.conflist").read_text())
    assert [p["type"] for p in conf["plugins"]] == ["podwire", "portmap"]
    assert conf["plugins"][0]["network"] == "pods"
    # What containerd 1.6 reads by default; 1.1.0 (STATUS, GC) on request, junk refused.
    assert conf["cniVersion"] == "1.0.0"
    newer = parser.parse_args([*args_of(tmp_path), "--cni-version", "1.1.0"])
    assert newer.handler(newer) == 0
    conf = json.loads((tmp_path / "conf" / "10-podwire.conflist").read_text())
    assert conf["cniVersion"] == "1.1.0"
    odd = parser.parse_args([*args_of(tmp_path), "--cni-version", "0.3.1"])
    with pytest.raises(ConfigError, match="--cni-version"):
        odd.handler(odd)
    bad = parser.parse_args(
        ["cni", "install", "--bin-dir", "b", "--conf-dir", "c", "--network", "a b"]
    )
    with pytest.raises(ConfigError, match="--network"):
        bad.handler(bad)


def test_cni_build_makes_the_c_plugin_and_reports_a_failing_compiler(tmp_path: Any) -> None:
    from podwire.cli.main import main
    from podwire.cni.build import build
    from podwire.errors import PermanentError

    assert main(["cni", "build", "--output", str(tmp_path / "ok" / "podwire-cni")]) == 0
    assert (tmp_path / "ok" / "podwire-cni").read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(PermanentError, match=r"false failed to build .*podwire-cni\.c: exit 1"):
        build(tmp_path / "bad" / "podwire-cni", compiler="false")
    assert list((tmp_path / "bad").iterdir()) == []  # no half-written plugin left
