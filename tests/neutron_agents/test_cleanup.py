"""What a stopped DHCP agent leaves is removed by its command line's mark: every dnsmasq
naming the agent's conf dir of a network, not only the one its pid file records."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from podwire.stack import procs
from podwire.stack.agent_cleanup import clean_dhcp


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
