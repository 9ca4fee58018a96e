"""The README's etcd-auth steps, as an operator runs them, against a real etcd with auth on.

``podwire etcd grant-node`` makes the node's user; ``podwire agent`` runs with the two lines it
printed, registers, sees its peers, cannot touch another node's keys, and comes back by itself
after etcd restarts (not ready while etcd is away, ready again after re-authenticating).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from podwire import keys
from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.etcd.errors import EtcdPermissionDenied
from podwire.etcd.roles import Grant, RoleSpec
from podwire.schema import nodes as values
from podwire.stack.netutil import free_port
from tests.agent.netenv import NetEnv
from tests.conftest import PODWIRE
from tests.etcd.authetcd import ROOT_PASSWORD, AuthEtcd, started
from tests.scripted_agent import ScriptedAgent, eventually


def grant_node(node: str, root_config: Path) -> subprocess.CompletedProcess[str]:
    argv = [*PODWIRE, "etcd", "grant-node", node, "--config", str(root_config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done


def etcd_section(authed: AuthEtcd, lines: str) -> str:
    return f'[etcd]\nendpoints = ["{authed.endpoint}"]\ntimeout = 2.0\n{lines}'


def printed_settings(authed: AuthEtcd, stdout: str) -> EtcdSettings:
    fields = dict(line.split(" = ", 1) for line in stdout.splitlines())
    return authed.settings(fields["user"].strip('"'), fields["password"].strip('"'))


async def ready(url: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response,
        ):
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def not_ready(url: str) -> bool:
    return not await ready(url)


def agent_config(path: Path, etcd: str, neutron: str, node: str, ns: str, vtep: str) -> str:
    ops = f"127.0.0.1:{free_port()}"
    path.write_text(
        etcd
        + f'[neutron]\nendpoint = "{neutron}"\n'
        + f'[agent]\nhost = "{node}"\nvtep_ip = "{vtep}"\nhost_netns = "{ns}"\n'
        + f'cni_socket = "{path.parent / "agent.sock"}"\n'
        + f'state_dir = "{path.parent / "state"}"\n'
        + f'vif_source = "neutron"\nops_listen = "{ops}"\nheartbeat_ttl = 10\n'
    )
    return f"http://{ops}/readyz"


async def test_documented_node_user_end_to_end(
    tmp_path: Path, netenv: NetEnv, neutron_endpoint: str
) -> None:
    node, peer, late = (f"{netenv.tag}-{suffix}" for suffix in ("a", "b", "c"))
    ns, vtep = netenv.host(1)
    async with started(tmp_path) as authed:
        root_config = tmp_path / "etcd-root.toml"
        root_config.write_text(
            etcd_section(authed, f'user = "root"\npassword = "{ROOT_PASSWORD}"\n')
        )
        granted = grant_node(node, root_config).stdout
        assert [line.split(" = ")[0] for line in granted.splitlines()] == ["user", "password"]
        again = grant_node(node, root_config).stdout  # a re-run keeps the node's password
        assert again.splitlines()[0] == granted.splitlines()[0]
        assert "password unchanged" in again
        readyz = agent_config(
            tmp_path / "podwire.toml",
            etcd_section(authed, granted),
            neutron_endpoint,
            node,
            ns,
            vtep,
        )
        peer_user = printed_settings(authed, grant_node(peer, root_config).stdout)
        late_user = printed_settings(authed, grant_node(late, root_config).stdout)
        async with (
            await EtcdClient.connect(printed_settings(authed, granted)) as mine,
            await EtcdClient.connect(peer_user) as peer_etcd,
            await EtcdClient.connect(late_user) as late_etcd,
        ):
            await ScriptedAgent(peer_etcd, peer).register(vtep="192.0.2.201", ttl=60)
            log = tmp_path / "agent.log"
            agent = await asyncio.create_subprocess_exec(
                *PODWIRE,
                *("agent", "--config", str(tmp_path / "podwire.toml")),
                stdout=log.open("ab"),
                stderr=subprocess.STDOUT,
            )
            try:
                await eventually(lambda: ready(readyz), "agent ready", timeout=60)
                assert await mine.get(keys.state_alive(node)) is not None
                await eventually(lambda: logged(log, "192.0.2.201"), "peer seen")
                await refused_elsewhere(mine, peer)
                await lies_and_borrowed_leases_fail(peer_etcd, late_etcd, peer, log)

                authed.etcd.stop()
                await eventually(lambda: not_ready(readyz), "not ready while etcd is away")
                authed.etcd.start()
                await eventually(lambda: ready(readyz), "ready after etcd is back", timeout=60)
                # Its watches re-authenticated too: a node registering now is seen.
                await ScriptedAgent(late_etcd, late).register(vtep="192.0.2.202", ttl=60)
                await eventually(lambda: logged(log, "192.0.2.202"), "peer seen after restart")
                assert "etcd.token_rejected" in log.read_text()
            finally:
                if agent.returncode is None:
                    agent.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(agent.wait(), 30)
                assert code == 0, log.read_text()[-3000:]
            assert await mine.get(keys.state_alive(node)) is None  # revoked on the way out


async def logged(path: Path, text: str) -> bool:
    return text in path.read_text()


async def lies_and_borrowed_leases_fail(
    peer_etcd: EtcdClient, late_etcd: EtcdClient, peer: str, log: Path
) -> None:
    """With its own etcd user, a node claims a port Neutron never bound to it: refused. And
    another node's user keeps the peer's heartbeat lease alive after the peer stopped beating
    (etcd authorizes no LeaseKeepAlive): the agent sees the beat go stale all the same."""
    await peer_etcd.put(keys.state_port(peer, str(uuid.uuid4())), values.port_state_value(0.0))
    await eventually(lambda: logged(log, f"host={peer} key=ports/"), "the lie refused")
    assert "no port of that id is bound to that host" in log.read_text()
    lease = await peer_etcd.grant_lease(60)
    beat = values.alive_value(time.time(), "t", time.time(), 1)
    await peer_etcd.put(keys.state_alive(peer), beat, lease=lease.id)  # then it stops beating
    assert await late_etcd.refresh_lease(lease.id) > 0  # someone else's user, accepted
    await eventually(lambda: logged(log, f"agent.peer.heartbeat_stale host={peer}"),
                     "the borrowed lease kept the key, not the node", timeout=20)  # fmt: skip
    assert await late_etcd.get(keys.state_alive(peer)) is not None


async def refused_elsewhere(mine: EtcdClient, peer: str) -> None:
    """The node's own user cannot write another node's keys nor its desired ports (it reads
    them: Neutron's bindings are what a peer's claims are checked against)."""
    with pytest.raises(EtcdPermissionDenied, match=keys.state_alive(peer)):
        await mine.put(keys.state_alive(peer), b"{}")
    with pytest.raises(EtcdPermissionDenied, match=keys.node_port(peer, "p")):
        await mine.put(keys.node_port(peer, "p"), b"{}")
    await mine.get_prefix(keys.node_ports_prefix(peer))
    assert await mine.get(keys.state_alive(peer)) is not None


async def test_agent_with_a_too_narrow_role_or_a_wrong_password_exits_with_one_line(
    tmp_path: Path, netenv: NetEnv, neutron_endpoint: str
) -> None:
    """The role the README once documented lacked the peers listing: the agent must say so."""
    node = f"{netenv.tag}-n"
    ns, vtep = netenv.host(1)
    narrow = RoleSpec(
        "narrow",
        (Grant("read", keys.nodes_prefix()), Grant("readwrite", keys.state_node_prefix(node))),
    )
    async with started(tmp_path) as authed:
        for password, expected in (
            ("pw", ": permission denied for etcd user 'narrow-user': its role does not cover"),
            ("wrong", "etcd refused user 'narrow-user': wrong user name or password"),
        ):
            await authed.user("narrow-user", narrow, "pw")
            lines = f'user = "narrow-user"\npassword = "{password}"\n'
            config = tmp_path / "podwire.toml"
            agent_config(config, etcd_section(authed, lines), neutron_endpoint, node, ns, vtep)
            proc = await asyncio.create_subprocess_exec(
                *PODWIRE,
                *("agent", "--config", str(config)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 2
            last = err.decode().strip().splitlines()[-1]
            assert last.startswith("podwire agent: error: ") and expected in last, err.decode()
            if password == "pw":  # the peers', the policy's or the Services' listing, whichever
                # asked first
                assert re.search(r"etcd list /podwire/(state/nodes|global|services)/: ", last), last
            assert "Traceback" not in err.decode()
