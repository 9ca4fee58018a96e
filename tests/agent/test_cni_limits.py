"""Both plugin builds handle every config the agent accepts: sizes up to the limit, any byte,
an agent that closes early; over the limit or not UTF-8 gets a clear CNI error."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from podwire.agent.cni import socket_proto as wire
from podwire.agent.cni.request import MAX_CONFIG, MAX_CONFIG_EXTRA
from podwire.cni import spec
from tests.agent.harness import CniCall, HostAgent, acni
from tests.agent.netenv import NetEnv, links_in

pytestmark = pytest.mark.stack

# Every kind of character a JSON string may carry: escapes the plugin must escape again,
# non-ASCII of 2, 3 and 4 bytes, and control characters written as JSON escapes.
PAD_UNIT = '"\\/é€😀\n\t\x01 '


def padded(conf: dict[str, Any], size: int) -> str:
    """``conf`` serialised (UTF-8, not ASCII-escaped) to exactly ``size`` bytes."""
    base = len(json.dumps({**conf, "pad": ""}, ensure_ascii=False).encode())
    unit = json.dumps(PAD_UNIT, ensure_ascii=False)[1:-1]
    pad = json.loads(f'"{unit * ((size - base) // len(unit.encode()))}"')
    text = json.dumps({**conf, "pad": pad}, ensure_ascii=False)
    text = text[:-1] + " " * (size - len(text.encode())) + "}"
    assert len(text.encode()) == size
    return text


async def raw_cni(binary: Path, env: dict[str, str | bytes], stdin: bytes) -> CniCall:
    """A plugin run with arbitrary bytes in env and stdin (the harness speaks text)."""
    argv = [sys.executable, str(binary)] if binary.suffix == ".py" else [str(binary)]
    full = {b"PATH": os.environb.get(b"PATH", b"/usr/bin:/bin")}
    full.update({k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in env.items()})
    proc = await asyncio.create_subprocess_exec(
        *argv, env=full, stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return CniCall(proc.returncode, out.decode())


async def test_config_at_the_limit_adds_and_its_del_with_prev_result_succeeds(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path
) -> None:
    agent, ns, cid = agents[0], netenv.namespace("big"), uuid.uuid4().hex
    conf = agent.conf(vxnet.id)
    add = await acni(
        plugin, "ADD", padded(conf, MAX_CONFIG), container_id=cid, netns=f"/run/netns/{ns}"
    )
    assert add.code == 0, add.stdout[:500]
    assert "eth0" in links_in(ns)
    # A runtime sends DEL the ADD config plus prevResult: more than MAX_CONFIG in all.
    with_prev = padded({**conf, "prevResult": add.json}, MAX_CONFIG + MAX_CONFIG_EXTRA)
    delete = await acni(plugin, "DEL", with_prev, container_id=cid)
    assert delete.code == 0, delete.stdout[:500]
    assert links_in(ns) == ["lo"]


async def test_config_over_the_limit_gets_a_decode_error_and_creates_nothing(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, neutron: Any
) -> None:
    agent, ns = agents[0], netenv.namespace("over")
    conf = padded(agent.conf(vxnet.id), MAX_CONFIG + 1)
    add = await acni(plugin, "ADD", conf, container_id="c1", netns=f"/run/netns/{ns}")
    assert add.code == spec.DECODE_FAILURE, add.stdout
    assert "too large" in add.json["msg"] and str(MAX_CONFIG) in add.json["msg"]
    assert links_in(ns) == ["lo"]
    assert list(neutron.network.ports(network_id=vxnet.id, device_owner="compute:podwire")) == []


async def test_any_byte_gets_an_answer_that_names_the_problem(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path
) -> None:
    agent, ns = agents[0], netenv.namespace("bytes")
    env: dict[str, str | bytes] = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": f"/run/netns/{ns}",
        "CNI_IFNAME": "eth0",
        "PODWIRE_CNI_SOCKET": agent.socket,
    }
    good = json.dumps(agent.conf(vxnet.id)).encode()
    cases: list[tuple[str, dict[str, str | bytes], bytes, int, str]] = [
        ("invalid UTF-8 in stdin", {}, good[:-1] + b',"x":"\xff\xfe"}', 6, "not valid UTF-8"),
        ("overlong UTF-8", {}, good[:-1] + b',"x":"\xc0\xaf"}', 6, "not valid UTF-8"),
        ("UTF-8 surrogate", {}, good[:-1] + b',"x":"\xed\xa0\x80"}', 6, "not valid UTF-8"),
        ("invalid UTF-8 in env", {"CNI_ARGS": b"K8S_POD_NAME=\xff"}, good, 4, "CNI_ARGS"),
        ("invalid UTF-8 netns", {"CNI_NETNS": b"/run/netns/\xff"}, good, 4, "CNI_NETNS"),
        ("raw control byte", {}, good[:-1] + b',"x":"a\x01b"}', 6, "not valid JSON"),
        ("NUL byte", {}, good[:-1] + b',"x":"a\x00b"}', 6, "not valid JSON"),
        ("quotes and backslashes", {"CNI_ARGS": 'A="\\"'}, good, 0, ""),
        ("non-ASCII env", {"CNI_ARGS": "A=é€😀"}, good, 0, ""),
    ]
    for what, extra, stdin, code, msg in cases:
        call = await raw_cni(plugin, {**env, **extra}, stdin)
        assert call.code == code, (what, call.stdout)
        if code:
            assert msg in call.json["msg"], (what, call.json)
            assert links_in(ns) == ["lo"], what
        else:
            assert "eth0" in links_in(ns), what
            netns: dict[str, str | bytes] = {"CNI_NETNS": b"/run/netns/\xfe"}  # ignored by DEL
            delete = await raw_cni(plugin, {**env, **extra, **netns, "CNI_COMMAND": "DEL"}, stdin)
            assert delete.code == 0, (what, delete.stdout)


async def test_agent_closing_early_is_a_cni_error_not_sigpipe(
    agents: list[HostAgent], netenv: NetEnv, vxnet: Any, plugin: Path, monkeypatch: Any
) -> None:
    """The agent refuses a request over its limit after reading only the limit, and closes
    while the plugin is still sending: the plugin prints the agent's answer."""
    agent, ns = agents[0], netenv.namespace("pipe")
    monkeypatch.setattr(wire, "MAX_REQUEST", 64 << 10)
    conf = padded(agent.conf(vxnet.id), MAX_CONFIG)
    add = await acni(plugin, "ADD", conf, container_id="c1", netns=f"/run/netns/{ns}")
    assert add.code == spec.DECODE_FAILURE, (add.code, add.stdout)  # -13 would be SIGPIPE
    assert "larger than 65536 bytes" in add.json["msg"]
    assert links_in(ns) == ["lo"]
