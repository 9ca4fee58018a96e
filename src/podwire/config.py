"""Typed settings: one TOML file, ``PODWIRE_<SECTION>_<KEY>`` env overrides, checked at start.

Each section is a frozen dataclass. Loading rejects unknown sections and keys (a typo must not
silently fall back to a default) and names the offending key in the error. The loaded object is
passed explicitly to whatever needs it; nothing reads settings from a global.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire.errors import ConfigError, ValidationError
from podwire.keys import check_segment
from podwire.schema import fields
from podwire.schema.deployment import DEFAULT_NAME, Deployment
from podwire.schema.nodes import POD_DRIVERS, RENAMED_POD_DRIVERS

ENV_PREFIX = "PODWIRE_"
# Keys outside any section: ``deployment`` (env ``PODWIRE_DEPLOYMENT``).
TOP_LEVEL = ("deployment",)
# Where the agent's CNI server listens and every plugin looks unless told otherwise: the one
# default of the socket path, imported by the CLI and the conflist. The C plugin and the
# stdlib fallback can import nothing and repeat it (tests/unit/test_cni_limits.py checks both).
AGENT_SOCKET = "/run/podwire/agent.sock"


@dataclass(frozen=True)
class EtcdSettings:
    """How every podwire process reaches etcd (the ml2 driver has its own ``[ml2_podwire]``
    options in neutron.conf, docs/ml2.md)."""

    # The cluster's members, as a list or one comma-separated string ("a,b"); the client holds
    # a channel per member and fails over between them (docs/scale.md).
    endpoints: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    # CA bundle for TLS; a CA file or an https:// endpoint turns TLS on.
    ca_file: str = ""
    # Client certificate for TLS, with key_file (both or neither).
    cert_file: str = ""
    # Private key of cert_file.
    key_file: str = ""
    # etcd user, with password (both or neither): the two lines ``podwire etcd
    # grant-node/grant-server`` prints (docs/etcd-auth.md).
    user: str = ""
    # Password of user.
    password: str = ""
    # Seconds per etcd call.
    timeout: float = 5.0

    def validate(self) -> None:
        if not self.endpoints:
            raise ConfigError("etcd.endpoints: at least one endpoint is required")
        for endpoint in self.endpoints:
            _check_url(endpoint, "etcd.endpoints")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("etcd.cert_file and etcd.key_file must be given together")
        if bool(self.user) != bool(self.password):
            raise ConfigError("etcd.user and etcd.password must be given together")
        _check_positive(self.timeout, "etcd.timeout")


@dataclass(frozen=True)
class NeutronSettings:
    """How the controller (and the agent with ``vif_source = "neutron"``) reaches Neutron: a
    noauth endpoint or a ``clouds.yaml`` cloud, one of the two."""

    # URL of a Neutron without authentication (the local stack's).
    endpoint: str = ""
    # A cloud from clouds.yaml: a service user allowed to create ports in the pods' projects
    # and to bind them.
    cloud: str = ""
    # Read by no component; accepted so that config files that set it still load.
    project_id: str = ""

    def validate(self) -> None:
        if self.endpoint and self.cloud:
            raise ConfigError("neutron: give either endpoint (noauth) or cloud, not both")
        if self.endpoint:
            _check_url(self.endpoint, "neutron.endpoint")


@dataclass(frozen=True)
class ControllerSettings:
    """The controller's HTTP API: the VIF API for agents and the admin API (docs/controller.md)."""

    # HOST:PORT of the VIF and admin API (also /healthz, /readyz, /metrics).
    listen: str = "127.0.0.1:7070"
    # Bearer token of the admin API (``podwire pools``, ``podwire status``).
    admin_token: str = ""
    # One bearer token per node, ``{ node-1 = "..." }``: a node's token acts only for that node.
    node_tokens: dict[str, str] = field(default_factory=dict)
    # The URL agents and operators reach this controller at; a standby names the leader's in
    # its refusals. Empty: http://LISTEN (this host's name where LISTEN is a wildcard).
    advertise_url: str = ""

    def validate(self) -> None:
        _check_host_port(self.listen, "controller.listen")
        if self.advertise_url:
            _check_url(self.advertise_url, "controller.advertise_url")
        for node in self.node_tokens:
            _check_name(node, "controller.node_tokens")


@dataclass(frozen=True)
class PoolSettings:
    """The controller's pools of pre-created, pre-bound ports, one per (node, project, network)
    and security-group set (docs/controller.md, docs/scale.md)."""

    # Ready ports a pool keeps (the floor of adaptive sizing).
    min: int = 5
    # Most ports a pool holds; 0: no limit.
    max: int = 0
    # Ports created per bulk request when a pool refills.
    batch: int = 10
    # Seconds between recycling passes (released ports back into their pools with their
    # current security groups), and between retries of recovery's check against Neutron.
    update_interval: float = 20.0
    # A release starts a recycling pass at once, its security groups read from the forwarder's
    # mirror in etcd (no Neutron call); false, or no running forwarder: released ports wait for
    # the next update_interval pass.
    recycle_on_release: bool = True
    # Bulk creations in flight at once.
    bulk_concurrency: int = 20
    # Seconds a populate or a refill waits for the refill its pool is already running before it
    # answers "still being filled; retry later".
    populate_timeout: float = 420.0
    # Seconds between passes that free the pools of nodes without a live agent and delete
    # podwire's unbound ports nobody knows (each only once seen on two passes in a row).
    node_cleanup_interval: float = 600.0
    # Seconds a node may be without a live agent before everything it held is released: its
    # in-use ports deleted in Neutron (their addresses free), their records dropped, its pools
    # freed, as ``podwire nodes remove`` does; 0: never (only its pools are freed).
    node_release_after: float = 900.0
    # Name pooled ports "available-port" and ports in use after their pod, for debugging.
    port_debug: bool = False
    # The pod driver of nodes whose registration names none: "baremetal" (ports bound to the
    # node), "nested" (subports of the node's trunk) or "unpooled" (no pool: a port created per
    # request and deleted on release; "noop", its earlier name, still works and is logged as
    # deprecated).
    default_driver: str = "baremetal"
    # Rebinds tried for a new port whose binding failed before it is deleted (0: delete at once).
    binding_retries: int = 2
    # Adaptive sizing (controller/sizing.py): per pool, ready ports = learned request rate x
    # measured bulk-create time x headroom, within [min, max]; back to min after idle_ttl.
    # false: every pool keeps min.
    adaptive: bool = True
    idle_ttl: float = 300.0  # seconds without a request before a pool shrinks to min
    rate_window: float = 2.0  # seconds per rate-averaging window
    rate_smoothing: float = 0.5  # weight of the newest window in the rate average (0 < w <= 1)
    headroom: float = 2.0  # multiplier on the expected demand during one refill (>= 1)
    # Seconds without a request, a release or a returned port a pool waits before topping
    # itself up while it holds more than its floor (pool.min, or what its sustained drain
    # takes while a refill lands): a sudden burst is served from the pool and Neutron is left
    # alone until the burst is over, sandboxes started (a Neutron sharing the node's CPU
    # otherwise slows the burst it refills for), and if its pods are deleted meanwhile their
    # ports come back instead. Below the floor it refills at once. 0: top up after every
    # request.
    refill_pause: float = 2.0
    # Nested nodes bound to their trunk by id, ``{ node-1 = "<trunk uuid>" }``: such a node's
    # pod ports go on that trunk only. A node not listed uses the trunk named after it in the
    # pool's project. Either way a trunk of another project than the pool's is refused.
    nested_trunks: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        for name in ("min", "max", "binding_retries", "node_release_after"):
            if getattr(self, name) < 0:
                raise ConfigError(f"pool.{name}: must be 0 or more")
        if self.max and self.min > self.max:
            raise ConfigError("pool.min: must not exceed pool.max (0 means no limit)")
        for name in ("batch", "bulk_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"pool.{name}: must be 1 or more")
        for name in (
            "update_interval",
            "populate_timeout",
            "node_cleanup_interval",
            "idle_ttl",
            "rate_window",
        ):
            _check_positive(getattr(self, name), f"pool.{name}")
        if not 0 < self.rate_smoothing <= 1:
            raise ConfigError("pool.rate_smoothing: must be greater than 0 and at most 1")
        if self.headroom < 1:
            raise ConfigError("pool.headroom: must be 1 or more")
        if self.refill_pause < 0:
            raise ConfigError("pool.refill_pause: must be 0 or more")
        if self.default_driver not in (*POD_DRIVERS, *RENAMED_POD_DRIVERS):
            raise ConfigError("pool.default_driver: must be baremetal, nested or unpooled")
        self._validate_nested_trunks()

    def _validate_nested_trunks(self) -> None:
        """A trunk carries one node's pods: a name that is no node, an id that is no trunk
        id, or one trunk given to two nodes is refused before any port is made."""
        owners: dict[str, str] = {}
        for node, trunk_id in self.nested_trunks.items():
            _check_name(node, "pool.nested_trunks")
            try:
                fields.uuid(trunk_id, f"pool.nested_trunks.{node}")
            except ValidationError as exc:
                raise ConfigError(str(exc)) from exc
            if trunk_id in owners:
                raise ConfigError(
                    f"pool.nested_trunks: trunk {trunk_id} is given to both {owners[trunk_id]!r}"
                    f" and {node!r}; a trunk carries the pods of one node"
                )
            owners[trunk_id] = node


@dataclass(frozen=True)
class AgentSettings:
    """The node agent (docs/agent.md): registration, wiring, security groups, the CNI server."""

    # This node's name as Neutron binds ports to it (binding:host_id); required by the agent,
    # and a key segment in etcd.
    host: str = ""
    # The controllers' VIF API; several comma-separated: an unavailable one, or the standby
    # answering 503, sends the next call to the next.
    controller_url: str = "http://127.0.0.1:7070"
    # This node's bearer token for the VIF API (controller.node_tokens).
    token: str = ""
    # The CNI server's unix socket (root only; at most 107 bytes).
    cni_socket: str = AGENT_SOCKET
    # Where the agent keeps its checkpoints (cni-attachments.json, memif-attachments.json).
    state_dir: str = "/var/lib/podwire"
    # Underlay IP for VXLAN; without it the node serves no vxlan ports.
    vtep_ip: str = ""
    # The interface serving each physnet, ``{ physnet1 = "eth1" }`` (flat and VLAN networks).
    physnet_mappings: dict[str, str] = field(default_factory=dict)
    # Seconds of the heartbeat lease; at least 2.
    heartbeat_ttl: int = 30
    # Simulated host: all kernel work in this named network namespace (tests, demo, benches).
    host_netns: str = ""
    # "linux": bridges, VXLAN, veths. "none": registration, desired ports -> wired state and
    # peers only, with no kernel work and no CNI socket (many simulated nodes on one machine).
    dataplane: str = "linux"
    # Where CNI ADD gets a pod's port: "controller" (the VIF API, pools) or "neutron" (the agent
    # creates and deletes one Neutron port per attachment itself; needs [neutron]).
    vif_source: str = "controller"
    # HOST:PORT for /healthz, /readyz, /metrics; empty: no ops endpoint.
    ops_listen: str = ""
    # Seconds an ADD may wait for a VIF and for the binder to wire its port.
    cni_timeout: float = 60.0
    # Seconds between a pod's last DEL and releasing its device-plugin grant (a sandbox
    # re-creation ADDs again within this time and keeps the grant).
    pod_release_grace: float = 30.0
    # Nested mode (the node is a VM on a Neutron trunk): pods whose VIF carries a vlan_id get a
    # VLAN sub-interface of this uplink. Empty: not nested.
    nested_uplink: str = ""
    # Security groups and port security on this node's ports (docs/security-groups.md):
    # "enforce" (nftables tables bridge/inet podwire) or "off" (no filtering at all).
    security_groups: str = "enforce"
    # Seconds an ADD waits for its port's groups to be published before it goes on without
    # them (what they would allow stays dropped until they arrive).
    security_group_wait: float = 5.0

    def _validate_security_groups(self) -> None:
        if self.security_groups not in ("enforce", "off"):
            raise ConfigError("agent.security_groups: must be 'enforce' or 'off'")
        if self.security_group_wait < 0:
            raise ConfigError("agent.security_group_wait: must be 0 or more")

    def _validate_node(self) -> None:
        """What other nodes and Neutron learn about this one: its name, VTEP, physnets."""
        if self.host:
            _check_name(self.host, "agent.host")
        if self.vtep_ip:
            try:
                fields.vtep_address(self.vtep_ip, "agent.vtep_ip")
            except ValidationError as exc:
                raise ConfigError(str(exc)) from exc
        for physnet, interface in self.physnet_mappings.items():
            _check_name(physnet, "agent.physnet_mappings")
            if not interface or len(interface) > 15 or "/" in interface:
                raise ConfigError(
                    f"agent.physnet_mappings: interface {interface!r} for {physnet!r}"
                    " is not a valid Linux interface name"
                )

    def validate(self) -> None:
        self._validate_security_groups()
        if self.vif_source not in ("controller", "neutron"):
            raise ConfigError("agent.vif_source: must be 'controller' or 'neutron'")
        if self.ops_listen:
            _check_host_port(self.ops_listen, "agent.ops_listen")
        _check_positive(self.cni_timeout, "agent.cni_timeout")
        if self.pod_release_grace < 0:
            raise ConfigError("agent.pod_release_grace: must be 0 or more")
        if self.host_netns and ("/" in self.host_netns or self.host_netns in (".", "..")):
            raise ConfigError("agent.host_netns: must be a name from 'ip netns list'")
        self._validate_node()
        for url in self.controller_url.split(","):
            _check_url(url.strip(), "agent.controller_url")
        if self.heartbeat_ttl < 2:
            raise ConfigError("agent.heartbeat_ttl: must be at least 2 seconds")
        if self.dataplane not in ("linux", "none"):
            raise ConfigError(
                "agent.dataplane: must be 'linux' (wire ports into the kernel) or 'none'"
                " (etcd and controller side only: no kernel work, no CNI socket)"
            )


@dataclass(frozen=True)
class DevicePluginSettings:
    """The memif device plugin for kubelet (docs/deviceplugin.md): inside the agent, or alone as
    ``podwire device-plugin``, whose flags of the same names override these."""

    # Run the device plugin inside ``podwire agent``.
    enabled: bool = False
    # The extended resource advertised to kubelet; device ids are ``<last part>-<index>``.
    resource_name: str = "podwire.io/memif"
    # How many containers can hold a memif at once (1 … 100000); a standalone plugin applies a
    # change live on SIGHUP.
    devices: int = 100
    # kubelet's device-plugin directory: the plugin's socket is created there, kubelet's
    # kubelet.sock is expected there.
    device_plugins_dir: str = "/var/lib/kubelet/device-plugins"
    # kubelet's PodResources API (v1), to reconcile grants after a restart.
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Where the per-container memif socket directories are created.
    memif_host_dir: str = "/var/run/podwire/memif"
    # Where that directory appears inside the container.
    memif_container_dir: str = "/run/vpp"
    # The grants' checkpoint file (root only).
    checkpoint: str = "/var/lib/podwire/memif-checkpoint.json"

    def validate(self) -> None:
        vendor, _, name = self.resource_name.partition("/")
        if not vendor or not name or "/" in name:
            raise ConfigError("deviceplugin.resource_name: must look like 'vendor.example/name'")
        if not 1 <= self.devices <= 100_000:
            raise ConfigError("deviceplugin.devices: must be between 1 and 100000")
        for key in ("device_plugins_dir", "memif_host_dir", "memif_container_dir"):
            if not os.path.isabs(getattr(self, key)):
                raise ConfigError(f"deviceplugin.{key}: must be an absolute path")


@dataclass(frozen=True)
class MemifSettings:
    """The node's memif master (docs/memif.md): one ``podwire-memif`` process serving every
    memif port of the node, on the kernel path or ring to ring (the shared path)."""

    # Serve memif for pods holding a grant (needs [deviceplugin] enabled and the built master).
    enabled: bool = True
    # The master program; empty: the one the set-up built next to the interpreter, or PATH.
    binary: str = ""
    # Regions a client may add (1 … 16); a client whose setup passes this or another ``max_*``
    # limit is refused, with the reason logged.
    max_regions: int = 4
    max_rings: int = 4  # rings per direction a client may add (1 … 16)
    max_log2_ring: int = 14  # a client's largest ring, log2 of its slots (1 … 15; 14: 16384)
    max_region_mb: int = 256  # a client's largest region, MiB (1 … 16384)
    # Seconds a client may take from connecting to "connect" before it is refused.
    handshake_timeout: float = 5.0
    # Microseconds the master keeps polling after the last frame before it sleeps again in
    # interrupt mode (lower latency under traffic; 0: interrupts only). Idle costs nothing.
    poll_us: int = 50
    # Scheduling priority of the master (nice, -20 … 19); a master waiting for a CPU adds
    # that wait to its frames' latency.
    nice: int = 0
    # Flows the master tracks for ports whose security groups it applies (1 … 16777216):
    # 64 bytes each plus 4 per hash bucket, allocated at start (100,000: 6.6 MiB). Flows never
    # replied to make room for a new one when it is full.
    max_flows: int = 100_000

    def validate(self) -> None:
        if not 1 <= self.max_regions <= 16:
            raise ConfigError("memif.max_regions: must be between 1 and 16")
        if not 1 <= self.max_rings <= 16:
            raise ConfigError("memif.max_rings: must be between 1 and 16")
        if not 1 <= self.max_log2_ring <= 15:
            raise ConfigError("memif.max_log2_ring: must be between 1 and 15")
        if not 1 <= self.max_region_mb <= 16384:
            raise ConfigError("memif.max_region_mb: must be between 1 and 16384")
        if not 0.001 <= self.handshake_timeout <= 600:
            raise ConfigError("memif.handshake_timeout: must be between 0.001 and 600 seconds")
        if not -20 <= self.nice <= 19:
            raise ConfigError("memif.nice: must be between -20 and 19")
        if not 0 <= self.poll_us <= 100_000:
            raise ConfigError("memif.poll_us: must be between 0 and 100000")
        if not 1 <= self.max_flows <= 1 << 24:
            raise ConfigError("memif.max_flows: must be between 1 and 16777216")
        if self.binary and not os.path.isabs(self.binary):
            raise ConfigError("memif.binary: must be an absolute path")


@dataclass(frozen=True)
class KubernetesSettings:
    """The leader controller's view of the Kubernetes API (docs/kubernetes.md): informers
    over Namespaces, Pods and NetworkPolicies, and NetworkPolicies enforced as Neutron
    security groups and address groups. Without a kubeconfig none of it runs and the
    controller never calls the API."""

    # The controller's kubeconfig (in a cluster: one that names its ServiceAccount's token
    # file, deploy/10-config.yaml). Empty: the controller does not read the Kubernetes API.
    # A file that is missing or unreadable stops the controller at start, naming it.
    kubeconfig: str = ""
    # The Neutron project the policies' security groups and address groups are made in: the
    # pods' project (a port takes only groups of its own project). Required with kubeconfig.
    project_id: str = ""
    # The Neutron subnet pool (id) that the subnet of each namespace annotated
    # ``podwire.io/network: auto`` is allocated from (docs/kubernetes.md, "Namespaces as
    # networks"). Set with cluster_router, or neither: then such namespaces' pods are
    # refused, naming these settings.
    subnet_pool: str = ""
    # The Neutron router (id) each such subnet is attached to, so that namespaces' networks
    # reach each other and whatever the router reaches.
    cluster_router: str = ""
    # Seconds a pod may be gone from the API while its port is still in use before the
    # controller releases (deletes) the port itself. kubelet tears a deleted pod's sandbox
    # down after the pod has left the API, and that DEL gives the port back to its pool;
    # what is still in use after this long is a pod deleted while its node's agent was down.
    gone_pod_grace: float = 30.0

    def validate(self) -> None:
        self._validate_auto_networks()
        if not 0 <= self.gone_pod_grace <= 3600:
            raise ConfigError(
                f"kubernetes.gone_pod_grace: {self.gone_pod_grace} is not within 0..3600 seconds"
            )
        if not self.kubeconfig:
            if self.project_id:
                raise ConfigError("kubernetes.project_id: set kubernetes.kubeconfig too")
            return
        if not self.project_id:
            raise ConfigError(
                "kubernetes.project_id: required with kubernetes.kubeconfig (the pods' project,"
                " where the NetworkPolicies' security groups are made)"
            )
        try:
            fields.project_id(self.project_id, "kubernetes.project_id")
        except ValidationError as exc:
            raise ConfigError(str(exc)) from exc

    def _validate_auto_networks(self) -> None:
        if bool(self.subnet_pool) != bool(self.cluster_router):
            raise ConfigError(
                "kubernetes.subnet_pool, kubernetes.cluster_router: set both or neither (a"
                " namespace's own network takes a subnet from the pool, attached to the router)"
            )
        if self.subnet_pool and not self.kubeconfig:
            raise ConfigError("kubernetes.subnet_pool: set kubernetes.kubeconfig too")
        for name in ("subnet_pool", "cluster_router"):
            if getattr(self, name):
                try:
                    fields.uuid(getattr(self, name), f"kubernetes.{name}")
                except ValidationError as exc:
                    raise ConfigError(str(exc)) from exc

    @property
    def auto_networks(self) -> bool:
        """Whether namespaces may ask for a network of their own (``auto``)."""
        return bool(self.subnet_pool)

    def kubeconfig_path(self) -> Path | None:
        """The kubeconfig, checked to be a readable file: a controller told to follow the
        API that cannot even read how to reach it must not start and run without policies."""
        if not self.kubeconfig:
            return None
        path = Path(self.kubeconfig)
        try:
            with path.open("rb"):
                pass
        except FileNotFoundError as exc:
            raise ConfigError(f"kubernetes.kubeconfig: {path} does not exist") from exc
        except OSError as exc:
            raise ConfigError(
                f"kubernetes.kubeconfig: {path} is not readable: {exc.strerror}"
            ) from exc
        return path


@dataclass(frozen=True)
class LogSettings:
    """Every process's structured log on stderr."""

    # DEBUG, INFO, WARNING or ERROR.
    level: str = "INFO"
    # "text": ``event key=value`` lines; "json": one JSON object a line.
    format: str = "text"

    def validate(self) -> None:
        if self.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log.level: must be DEBUG, INFO, WARNING or ERROR")
        if self.format not in ("text", "json"):
            raise ConfigError("log.format: must be text or json")


@dataclass(frozen=True)
class Settings:
    # The top-level ``deployment = "<name>"``: which installation this component belongs to.
    deployment: Deployment = field(default_factory=Deployment)
    etcd: EtcdSettings = field(default_factory=EtcdSettings)
    neutron: NeutronSettings = field(default_factory=NeutronSettings)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    pool: PoolSettings = field(default_factory=PoolSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    deviceplugin: DevicePluginSettings = field(default_factory=DevicePluginSettings)
    memif: MemifSettings = field(default_factory=MemifSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    log: LogSettings = field(default_factory=LogSettings)


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the TOML file (if any), apply env overrides, build and validate every section;
    the first problem is raised as a ConfigError."""
    problems: list[str] = []
    built = _build_sections(path, os.environ if env is None else env, problems)
    if problems:
        raise ConfigError(problems[0])
    return Settings(**built)


def config_problems(path: str | Path, env: Mapping[str, str] | None = None) -> list[str]:
    """Every problem of a config file as the services would read it (``podwire config
    check``): one line each, empty when the services would start with it."""
    problems: list[str] = []
    _build_sections(path, {} if env is None else env, problems)
    return problems


def _build_sections(
    path: str | Path | None, env: Mapping[str, str], problems: list[str]
) -> dict[str, Any]:
    try:
        raw = _read_toml(Path(path)) if path else {}
    except ConfigError as exc:
        problems.append(str(exc))
        return {}
    sections = [f.name for f in dataclasses.fields(Settings) if f.name not in TOP_LEVEL]
    problems += [
        f"unknown section [{name}]; known: {', '.join(sections)}"
        for name in raw
        if name not in sections and name not in TOP_LEVEL
    ]
    built: dict[str, Any] = {}
    deployment = env.get(f"{ENV_PREFIX}DEPLOYMENT", raw.get("deployment", DEFAULT_NAME))
    try:
        built["deployment"] = Deployment.named(deployment)
    except ValidationError as exc:
        problems.append(str(exc))
    for name in sections:
        section_raw = raw.get(name, {})
        if not isinstance(section_raw, dict):
            problems.append(f"[{name}] must be a table")
            continue
        section_cls = typing.get_type_hints(Settings)[name]
        try:
            merged = {**section_raw, **_env_overrides(name, section_cls, env)}
            keys_wrong = _key_problems(section_cls, merged, name)
            problems += keys_wrong
            if not keys_wrong:
                built[name] = build_section(section_cls, merged, name)
        except ConfigError as exc:
            problems.append(str(exc))
    return built


def build_section(cls: type[Any], raw: Mapping[str, Any], section: str) -> Any:
    """Make one section dataclass from a mapping, checking names and types, then validate."""
    problems = _key_problems(cls, raw, section)
    if problems:
        raise ConfigError(problems[0])
    hints = typing.get_type_hints(cls)
    values = {key: _check_type(value, hints[key], f"{section}.{key}") for key, value in raw.items()}
    instance = cls(**values)
    instance.validate()
    return instance


def _key_problems(cls: type[Any], raw: Mapping[str, Any], section: str) -> list[str]:
    """Every unknown key and every value of the wrong type in one section."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    problems = []
    for key, value in raw.items():
        if key not in known:
            problems.append(f"{section}.{key}: unknown key; known: {', '.join(sorted(known))}")
            continue
        try:
            _check_type(value, hints[key], f"{section}.{key}")
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except PermissionError as exc:
        raise ConfigError(f"config file {path} is not readable") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _env_overrides(section: str, cls: type[Any], env: Mapping[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    prefix = f"{ENV_PREFIX}{section.upper()}_"
    overrides: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(prefix):
            continue
        key = name[len(prefix) :].lower()
        if key not in hints:
            raise ConfigError(f"{name}: unknown key {section}.{key}")
        overrides[key] = _parse_env(value, hints[key], name)
    return overrides


def _parse_env(value: str, hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            lowered = value.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError("expected true or false")
            return lowered in ("1", "true", "yes")
        if hint is int:
            return int(value)
        if hint is float:
            return float(value)
        if origin is list:
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [item.strip() for item in value.split(",") if item.strip()]
        if origin is dict:
            if value.lstrip().startswith("{"):
                return json.loads(value)
            pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError("expected key=value pairs separated by commas")
            return {k.strip(): v.strip() for k, v in pairs}
    except ValueError as exc:
        raise ConfigError(f"{name}: cannot parse {value!r}: {exc}") from exc
    return value


def _check_type(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if type(value) is not hint:
            raise ConfigError(f"{key}: expected {hint.__name__}, got {type(value).__name__}")
        return value
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if item_type is str and isinstance(value, str):  # "a" or "a,b": one or several items
            return [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list) or not all(isinstance(v, item_type) for v in value):
            raise ConfigError(f"{key}: expected a list of {item_type.__name__}")
        return list(value)
    if origin is dict:
        _, item_type = typing.get_args(hint)
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, item_type) for k, v in value.items()
        ):
            raise ConfigError(f"{key}: expected a table of {item_type.__name__} values")
        return dict(value)
    raise ConfigError(f"{key}: unsupported setting type {hint!r}")


def _check_url(value: str, key: str) -> None:
    """The schema's URL rule (the one etcd values are read with), as a configuration error."""
    try:
        fields.http_url(value, key)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc


def _check_host_port(value: str, key: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT")


def _check_positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"{key}: must be greater than 0")


def _check_name(value: str, key: str) -> None:
    try:
        check_segment(value, key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
