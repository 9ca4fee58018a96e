"""The lean rtnetlink path against the real kernel, in throwaway namespaces."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from typing import Any

import pytest

from podwire.agent import naming
from podwire.agent.policy.enforcer import PolicyNotApplied
from podwire.agent.ports.veth import Plugger, PlugSpec
from podwire.netlink import HostNetlink, Netlink, NetlinkFailure, PodNetlink, RtnlError
from podwire.schema.checkpoints import Address
from podwire.schema.ports import HostRoute
from tests.agent.netenv import NetEnv, in_ns, links_in
from tests.scripted_agent import eventually


@pytest.fixture
def plugger(netenv: NetEnv) -> Iterator[tuple[Plugger, str, str]]:
    """A plugger whose host is a namespace with bridge ``br-t``; yields (plugger, host, pod)."""
    host, pod = netenv.namespace("h"), netenv.namespace("p")
    in_ns(host, "ip", "link", "add", "br-t", "type", "bridge")
    host_nl, pod_nl = HostNetlink(host), PodNetlink()
    try:
        yield Plugger(host_nl, pod_nl), host, pod
    finally:
        host_nl.close()
        pod_nl.close()


def _probe(nl: Netlink, name: str) -> tuple[int | None, bool]:
    return nl.link_index(name), nl.remove_link(name)


def _refused(nl: Netlink) -> str:
    try:
        nl.set_up(999_999)
    except RtnlError as exc:
        assert exc.code == errno.ENODEV
        return str(exc)
    raise AssertionError("setting a missing link up succeeded")


async def test_missing_links_read_as_absent_and_errors_carry_the_errno(netenv: NetEnv) -> None:
    host = netenv.namespace("h")
    nl = HostNetlink(host)
    try:
        assert await nl.run(_probe, "nope0") == (None, False)
        assert "No such device" in await nl.run(_refused)
    finally:
        nl.close()


def _spec(pod: str, bridge: str, gateway: str | None = "10.7.0.1") -> PlugSpec:
    return PlugSpec(
        "c1.eth0",
        f"/run/netns/{pod}",
        "eth0",
        "fa:16:3e:00:00:07",
        1400,
        bridge,
        (
            Address("10.7.0.5/24", gateway, (HostRoute("192.168.0.0/16", "10.7.0.254"),)),
            Address("fd00:7::5/64", None, (HostRoute("fd00:8::/64", "fd00:7::fe"),)),
        ),
    )


async def test_plug_configures_the_pod_end_and_unplug_removes_both(
    plugger: tuple[Plugger, str, str],
) -> None:
    plug, host, pod = plugger
    attached = await plug.plug(_spec(pod, "br-t"))
    link = in_ns(pod, "ip", "-d", "link", "show", "eth0").stdout
    assert "fa:16:3e:00:00:07" in link and "mtu 1400" in link and ",UP" in link
    addrs = in_ns(pod, "ip", "addr", "show", "eth0").stdout
    assert "10.7.0.5/24" in addrs and "fd00:7::5/64" in addrs
    assert "default via 10.7.0.1 dev eth0" in in_ns(pod, "ip", "route").stdout
    assert "192.168.0.0/16 via 10.7.0.254 dev eth0" in in_ns(pod, "ip", "route").stdout
    assert "fd00:8::/64 via fd00:7::fe dev eth0" in in_ns(pod, "ip", "-6", "route").stdout
    assert "master br-t" in in_ns(host, "ip", "link", "show", attached.host_ifname).stdout
    assert await plug.check(attached, "br-t") is None
    # Repeating the plug replaces the leftover instead of failing.
    await plug.plug(_spec(pod, "br-t"))
    assert await plug.unplug("c1.eth0") is True
    assert links_in(pod) == ["lo"] and attached.host_ifname not in links_in(host)
    assert await plug.unplug("c1.eth0") is False


async def test_failed_plug_leaves_nothing_behind(plugger: tuple[Plugger, str, str]) -> None:
    plug, host, pod = plugger
    with pytest.raises(NetlinkFailure, match="no such device"):
        await plug.plug(_spec(pod, "br-missing"))
    # The gateway is not on the pod's subnet: the route fails after the veth exists.
    with pytest.raises(NetlinkFailure, match=r"default via 192\.0\.2\.1"):
        await plug.plug(_spec(pod, "br-t", gateway="192.0.2.1"))
    assert links_in(pod) == ["lo"]
    assert links_in(host) == ["lo", "br-t"]


async def test_a_gated_plug_holds_the_host_end_down_until_the_gate_is_done(
    plugger: tuple[Plugger, str, str],
) -> None:
    plug, host, pod = plugger
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    plugging = asyncio.create_task(plug.plug(_spec(pod, "br-t"), gate))
    name = naming.host_veth("c1.eth0")

    async def born() -> bool:
        await asyncio.sleep(0.01)
        return "default via 10.7.0.1" in in_ns(pod, "ip", "route").stdout

    await eventually(born, "the pod end configured")
    held = in_ns(host, "ip", "link", "show", name).stdout
    assert "master br-t" in held and "state DOWN" in held and ",UP" not in held
    assert not plugging.done()  # the plug answers only after the gate
    gate.set_result(None)
    attached = await plugging
    assert ",UP" in in_ns(host, "ip", "link", "show", attached.host_ifname).stdout


async def test_a_failed_gate_removes_the_veth_and_is_raised(
    plugger: tuple[Plugger, str, str],
) -> None:
    plug, host, pod = plugger
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gate.set_exception(PolicyNotApplied("rules not in force"))
    with pytest.raises(PolicyNotApplied, match="rules not in force"):
        await plug.plug(_spec(pod, "br-t"), gate)
    assert links_in(pod) == ["lo"]
    assert links_in(host) == ["lo", "br-t"]


async def test_a_gate_open_before_the_veth_is_made_brings_it_up_in_the_same_job(
    plugger: tuple[Plugger, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plug, host, pod = plugger
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gate.set_result(None)
    jobs = []
    run = plug._host.run

    async def counted(fn: Any, *args: Any) -> Any:
        jobs.append(fn.__name__)
        return await run(fn, *args)

    monkeypatch.setattr(plug._host, "run", counted)
    attached = await plug.plug(_spec(pod, "br-t"), gate)
    assert ",UP" in in_ns(host, "ip", "link", "show", attached.host_ifname).stdout
    assert jobs == ["_plug_veth"]
