"""Config files for Neutron's agents against the local stack (``podwire neutron-agent``).

Every agent gets the same ``neutron.conf`` (the stack's RPC bus, the agent's ``host``, its state
dir, privsep without sudo) plus one ini of its own kind (``AGENT_INIS``: the DHCP and the L3
agent). The agents run as root: ``root_helper`` is empty, and each of
Neutron's privsep contexts starts its daemon with the venv's ``privsep-helper`` directly (the
default command would prefix ``sudo``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError

# Neutron's privsep contexts (neutron/privileged/__init__.py), each read from its own section.
PRIVSEP_SECTIONS = (
    "privsep",
    "privsep_dhcp_release",
    "privsep_ovs_vsctl",
    "privsep_namespace",
    "privsep_conntrack",
    "privsep_link",
)

AGENT_NEUTRON_CONF = """\
[DEFAULT]
host = {host}
transport_url = {transport_url}
state_path = {state_path}
debug = False
use_stderr = False
log_file = {log_file}
setproctitle = off
# On SIGTERM the agent's workers wait on their RPC threads for up to a minute; the runner
# removes what the agent made anyway.
graceful_shutdown_timeout = 5

[agent]
root_helper =
report_interval = 10

[oslo_concurrency]
lock_path = {state_path}/lock
{privsep}"""

DHCP_AGENT_INI = """\
[DEFAULT]
interface_driver = podwire
dhcp_driver = neutron.agent.linux.dhcp.Dnsmasq
dhcp_confs = {state_path}/dhcp
# No metadata proxy (haproxy) in the qdhcp- namespaces.
enable_isolated_metadata = False
force_metadata = False
num_sync_threads = 4

[podwire]
host_netns = {host_netns}
adopt_timeout = {adopt_timeout}
"""

L3_AGENT_INI = """\
[DEFAULT]
interface_driver = podwire
# Legacy routers: one qrouter- namespace on this host routes, SNATs and holds floating IPs.
agent_mode = legacy
# No metadata proxy (haproxy) in the qrouter- namespaces.
enable_metadata_proxy = False

[podwire]
host_netns = {host_netns}
adopt_timeout = {adopt_timeout}
"""

AGENT_INIS = {
    "dhcp": ("dhcp_agent.ini", DHCP_AGENT_INI),
    "l3": ("l3_agent.ini", L3_AGENT_INI),
}


@dataclass(frozen=True)
class AgentConfig:
    kind: str  # a key of AGENT_INIS
    base: Path  # DIR/neutron-agents/<host>/<kind>
    host: str
    transport_url: str
    host_netns: str = ""
    adopt_timeout: float = 10.0

    @property
    def etc(self) -> Path:
        return self.base / "etc"

    @property
    def state_path(self) -> Path:
        return self.base / "state"

    @property
    def log_file(self) -> Path:
        return agent_log(self.base, self.kind)

    @property
    def files(self) -> list[Path]:
        return [self.etc / "neutron.conf", self.etc / AGENT_INIS[self.kind][0]]

    def write(self) -> None:
        # Owner-only: neutron.conf holds the broker's URL with its credentials.
        self.etc.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.state_path / "lock").mkdir(parents=True, exist_ok=True)
        values = {
            "host": self.host,
            "transport_url": self.transport_url,
            "state_path": self.state_path,
            "log_file": self.log_file,
            "host_netns": self.host_netns,
            "adopt_timeout": self.adopt_timeout,
            "privsep": _privsep_sections(self.files),
        }
        neutron_conf, ini = self.files
        neutron_conf.write_text(AGENT_NEUTRON_CONF.format(**values))
        neutron_conf.chmod(0o600)
        ini.write_text(AGENT_INIS[self.kind][1].format(**values))

    def argv(self) -> list[str]:
        binary = _venv_binary(f"neutron-{self.kind}-agent")
        return [binary, *_config_args(self.files)]


def agent_log(base: Path, kind: str) -> Path:
    """The log file of the agent whose files are in ``base``."""
    return base / f"{kind}-agent.log"


def _privsep_sections(files: list[Path]) -> str:
    helper = " ".join([_venv_binary("privsep-helper"), *_config_args(files)])
    return "".join(f"\n[{section}]\nhelper_command = {helper}\n" for section in PRIVSEP_SECTIONS)


def _config_args(files: list[Path]) -> list[str]:
    return [arg for path in files for arg in ("--config-file", str(path))]


def _venv_binary(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise StackError(f"{path} not found: the neutron package is not installed here")
    return str(path)
