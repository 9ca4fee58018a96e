"""neutron.conf and ml2_conf.ini for the local stack (noauth, ML2, trunks and routers).

Without an RPC bus the transport is ``fake:/`` (in-process only) and the DHCP notifications
are off. With ``--rpc`` the same files serve the API under gunicorn and ``neutron-rpc-server``:
the API casts to the DHCP agents and schedules networks onto them, the RPC server answers them.
Neutron sets up its DHCP scheduler and agent notifiers only when ``rpc_workers`` is not 0, in
the API too.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import StackError

NEUTRON_CONF = """\
[DEFAULT]
core_plugin = ml2
service_plugins = trunk,router
auth_strategy = noauth
transport_url = {transport_url}
dhcp_agent_notification = {dhcp_notification}
# One RPC worker process (neutron-rpc-server, with --rpc) that also takes the agents' state
# reports: a second process would be a second Neutron plugin (and ml2 worker) on 2 cores.
rpc_workers = 1
rpc_state_report_workers = 0
# The RPC server keeps its command line (stale children are recognised by it).
setproctitle = off
allow_overlapping_ips = True
# The vlan-transparent extension, so a request for such a network reaches the drivers (which
# refuse it) instead of failing as an unknown attribute.
vlan_transparent = True
host = {host}
state_path = {state_path}
debug = False
use_stderr = False
log_file = {log_file}
api_workers = {workers}

[database]
connection = {db_url}
max_pool_size = 10
max_overflow = 20

[oslo_concurrency]
lock_path = {state_path}/lock

[quotas]
# Every request of the noauth stack counts against one project: Neutron's defaults (10 groups,
# 100 rules) would stop tests and benches with hundreds of rules.
quota_security_group = -1
quota_security_group_rule = -1

[ml2_podwire]
etcd_endpoints = {etcd_url}
deployments = {deployments}
{etcd_auth}"""

ML2_CONF = """\
[ml2]
type_drivers = flat,vlan,vxlan
project_network_types = vxlan
mechanism_drivers = podwire
extension_drivers = port_security,tag_ports_during_bulk_creation

[ml2_type_flat]
flat_networks = *

[ml2_type_vlan]
network_vlan_ranges = {vlan_ranges}

[ml2_type_vxlan]
vni_ranges = {vni_ranges}
"""


@dataclass(frozen=True)
class NeutronConfig:
    config_dir: Path
    state_path: Path
    log_file: Path
    db_url: str
    etcd_url: str
    workers: int
    host: str = "podwire-stack"
    vlan_ranges: str = "physnet1:100:999"
    vni_ranges: str = "1001:5000"
    etcd_user: str = ""
    etcd_password: str = ""
    transport_url: str = ""  # empty: no RPC bus (fake:/, no DHCP notifications)
    deployments: tuple[str, ...] = ("podwire",)  # whose nodes the ml2 driver serves

    def write(self) -> None:
        # Owner-only: neutron.conf may carry the etcd server user's password.
        self.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.config_dir.chmod(0o700)
        (self.state_path / "lock").mkdir(parents=True, exist_ok=True)
        values = {
            "host": self.host,
            "state_path": self.state_path,
            "log_file": self.log_file,
            "workers": self.workers,
            "db_url": self.db_url,
            "etcd_url": self.etcd_url,
            "vlan_ranges": self.vlan_ranges,
            "vni_ranges": self.vni_ranges,
            "deployments": ",".join(self.deployments),
            "transport_url": self.transport_url or "fake:/",
            "dhcp_notification": bool(self.transport_url),
            "etcd_auth": (
                f"etcd_user = {self.etcd_user}\netcd_password = {self.etcd_password}\n"
                if self.etcd_user
                else ""
            ),
        }
        (self.config_dir / "neutron.conf").write_text(NEUTRON_CONF.format(**values))
        (self.config_dir / "neutron.conf").chmod(0o600)
        (self.config_dir / "ml2_conf.ini").write_text(ML2_CONF.format(**values))
        shutil.copyfile(_api_paste_ini(), self.config_dir / "api-paste.ini")

    def config_args(self) -> list[str]:
        """The same files on a command line (neutron-rpc-server, which parses argv)."""
        files = ("neutron.conf", "ml2_conf.ini")
        return [arg for name in files for arg in ("--config-file", str(self.config_dir / name))]

    def environ(self) -> dict[str, str]:
        """What the WSGI shim reads to find this configuration."""
        return {
            "OS_NEUTRON_CONFIG_DIR": str(self.config_dir),
            "OS_NEUTRON_CONFIG_FILES": "neutron.conf;ml2_conf.ini",
        }


def _api_paste_ini() -> Path:
    """The api-paste.ini that the installed neutron package ships next to its data files."""
    candidates = [Path(sys.prefix) / "etc" / "neutron" / "api-paste.ini"]
    # Located without importing neutron, which would drag eventlet into the supervisor.
    spec = importlib.util.find_spec("neutron")
    if spec is None or spec.origin is None:
        raise StackError("the neutron package is not installed")
    candidates.append(Path(spec.origin).parent / "tests" / "etc" / "api-paste.ini")
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise StackError("api-paste.ini not found in the neutron installation")
