"""The CNI versions and chains a node runs, and the bad inputs a runtime hands over, through
containerd 1.6: the spec's answer, and nothing left behind."""

from __future__ import annotations

import grpc
import pytest

from tests.agent.netenv import in_ns, sh
from tests.cri.conftest import Node
from tests.cri.cri import Pod

pytestmark = pytest.mark.stack


async def _clean(node: Node) -> None:
    assert node.pod_veths() == []
    assert await node.port_ips() == {}


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
async def test_versions_containerd_reads(node: Node, version: str) -> None:
    await node.install(cni_version=version)
    sandbox = await node.cri.run(Pod.new(f"v{version.replace('.', '')}"))
    assert await node.cri.ip(sandbox) in (await node.port_ips()).values()
    await node.cri.stop(sandbox)
    await node.cri.remove(sandbox)
    await _clean(node)


async def test_version_110_is_refused_by_containerd_16_and_leaves_nothing(node: Node) -> None:
    await node.install(cni_version="1.1.0")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.cri.run(Pod.new("v110"))
    assert 'unsupported CNI result version "1.1.0"' in str(refused.value.details())
    await _clean(node)  # containerd's DEL after the failed ADD removed veth and port
    for sandbox in await node.cri.sandboxes():
        await node.cri.stop(sandbox)
        await node.cri.remove(sandbox)


async def test_unknown_version_gets_the_specs_error_and_creates_nothing(node: Node) -> None:
    conf = {
        "cniVersion": "9.9.9",
        "name": "podwire-future",
        "plugins": [_plugin(node)],
    }
    await node.use_conflist(conf)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.cri.run(Pod.new("future"))
    assert "cniVersion '9.9.9' is not supported" in str(refused.value.details())
    await _clean(node)
    # The sandbox stays until a config the plugin reads is back (its DEL is refused too).
    await node.install()
    for sandbox in await node.cri.sandboxes():
        await node.cri.stop(sandbox)
        await node.cri.remove(sandbox)
    await _clean(node)


def _plugin(node: Node) -> dict[str, object]:
    return {
        "type": "podwire",
        "network": node.network.id,
        "project": node.network.project_id,
        "agentSocket": node.agent.socket,
    }


def _nat_rules(node: Node) -> str:
    return in_ns(node.host_ns, "iptables-save", "-t", "nat").stdout


async def test_chained_portmap_maps_the_podwire_address(node: Node) -> None:
    await node.install(chain=["portmap"])
    sandbox = await node.cri.run(Pod.new("mapped"), port_mappings=[(80, 18080)])
    ip = await node.cri.ip(sandbox)
    rules = _nat_rules(node)
    assert f"--to-destination {ip}:80" in rules, rules  # portmap got podwire's prevResult
    assert "--dport 18080" in rules
    await node.cri.stop(sandbox)
    assert ip not in _nat_rules(node)
    await node.cri.remove(sandbox)
    await _clean(node)


async def test_sandbox_whose_netns_is_gone_is_stopped_with_an_empty_netns(node: Node) -> None:
    sandbox = await node.cri.run(Pod.new("gone"))
    netns = await node.cri.netns(sandbox)
    sh("ip", "netns", "del", netns.rpartition("/")[2])  # behind containerd's back
    await node.cri.stop(sandbox)  # containerd passes CNI_NETNS="" for a closed netns
    await _clean(node)
    await node.cri.stop(sandbox)  # the repeated DEL, again without a netns
    await node.cri.remove(sandbox)
    assert await node.cri.sandboxes() == []
