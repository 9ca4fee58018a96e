"""What a stopped Neutron agent leaves is removed by its marks: every dnsmasq naming the DHCP
agent's conf dir of a network (not only the one its pid file records), and the L3 agent's
router namespaces holding this host's marked pairs."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from podwire.ifdriver.naming import mark
from podwire.stack import procs
from podwire.stack.agent_cleanup import clean_dhcp, clean_l3
from tests.agent.netenv import NetEnv, in_ns, sh


def _fake_dnsmasq(conf_dir: Path) -> subprocess.Popen[bytes]:
    """A process that looks like the agent's dnsmasq (its name, its pid-file argument)."""
    return _named_dnsmasq(f"--pid-file={conf_dir}/pid")


def _named_dnsmasq(*args: str) -> subprocess.Popen[bytes]:
    sleeper = f"exec -a dnsmasq {sys.executable} -c 'import time; time.sleep(600)'"
    return subprocess.Popen(["bash", "-c", " ".join([sleeper, *args])])


def test_every_dnsmasq_of_the_agents_networks_is_stopped_and_strangers_are_not(
    tmp_path: Path,
) -> None:
    conf_dir = tmp_path / "dhcp" / "0b5b6a52-0000-4000-8000-000000000001"
    conf_dir.mkdir(parents=True)
    earlier, recorded = _fake_dnsmasq(conf_dir), _fake_dnsmasq(conf_dir)
    stranger = _named_dnsmasq("--pid-file=/elsewhere/pid")
    try:
        (conf_dir / "pid").write_text(f"{recorded.pid}\n")
        deadline = time.monotonic() + 10
        while len(procs.pids_marked(str(conf_dir))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both have exec'd
        assert procs.pids_marked(str(conf_dir)) == sorted([earlier.pid, recorded.pid])
        clean_dhcp(tmp_path, "no-such-host")
        assert earlier.wait(10) is not None and recorded.wait(10) is not None
        assert stranger.poll() is None  # not ours: left alone
        assert not conf_dir.exists()
    finally:
        for proc in (earlier, recorded, stranger):
            proc.kill()
            proc.wait()


def test_a_crashed_l3_agents_routers_go_and_other_hosts_routers_stay(netenv: NetEnv) -> None:
    """Two routers' namespaces, as Neutron's L3 agents of two hosts left them: each with a
    pair marked by the interface driver for its host, one with an address and a NAT rule."""
    ours, theirs = f"qrouter-{uuid.uuid4()}", f"qrouter-{uuid.uuid4()}"
    for name, host in ((ours, "host-a"), (theirs, "host-b")):
        sh("ip", "netns", "add", name)
        netenv.namespaces.append(name)  # removed after the test if the clean-up left it
        host_ns = netenv.namespace(f"{host[-1]}h")
        in_ns(name, "ip", "link", "add", "qr-0000000001", "type", "veth", "peer", "name",
              "tap0000000001", "netns", host_ns)  # fmt: skip
        in_ns(name, "ip", "link", "set", "qr-0000000001", "alias", mark(host, "p-" + host))
        in_ns(name, "ip", "addr", "add", "10.97.1.1/24", "dev", "qr-0000000001")
    in_ns(ours, "iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "MASQUERADE")
    clean_l3(Path("/nonexistent"), "host-a")
    listed = sh("ip", "netns", "list").stdout
    assert ours not in listed  # its devices, rules and conntrack state with it
    assert theirs in listed and "qr-0000000001" in in_ns(theirs, "ip", "link").stdout
