"""``podwire stack up/down``: run etcd, MariaDB and Neutron as one supervised unit.

With ``--rpc`` the unit also holds a private RabbitMQ (with its own epmd) and
``neutron-rpc-server``, which Neutron's agents (``podwire neutron-agent``) talk to. With
``--kubernetes`` it holds a Kubernetes control plane too (kube-apiserver on the stack's etcd,
kube-controller-manager, kube-scheduler: ``kube_control``).

The supervisor holds an exclusive ``flock`` on ``DIR/stack.lock`` for its whole life: that lock,
not the presence of ``stack.json``, says whether a stack runs on a data dir. A ``stack.json``
without a lock holder is what a crashed run leaves behind; its children (matched by their exact
recorded command line) are stopped before the new run starts.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from podwire.errors import StackError
from podwire.etcd.admin import ROOT_USER
from podwire.files import atomic_write
from podwire.log import get_logger
from podwire.stack import etcd_auth, etcd_server, kube_api, kube_control, kube_dns, procs
from podwire.stack.mariadb import MariaDB
from podwire.stack.netutil import free_port, http_ok, pick_port, wait_until
from podwire.stack.neutron_conf import NeutronConfig
from podwire.stack.rabbitmq import RabbitMQ

log = get_logger(__name__)

STACK_JSON = "stack.json"
SCHEMA_MARKER = "neutron-schema.done"
RPC_SERVER = "rpc-server"
# The queues neutron-rpc-server consumes: the agents' calls and their state reports.
RPC_QUEUES = ("q-plugin", "q-reports-plugin")
# Stopped in this order: Kubernetes' clients before its apiserver, the servers before the
# bus, the bus before the stores. Each Kubernetes component is a kind of its own: the stack
# cannot serve without any one of them.
STOP_ORDER = (
    kube_control.SCHEDULER,
    kube_control.CONTROLLER_MANAGER,
    kube_control.APISERVER,
    "neutron",
    "rpc",
    "rabbitmq",
    "epmd",
    "etcd",
    "mariadb",
)


@dataclass(frozen=True)
class StackOptions:
    data_dir: Path
    workers: int = 2
    ready_timeout: float = 120.0
    etcd_auth: bool = False
    etcd_members: int = 1  # 1, 3 or 5: a cluster on loopback
    neutron_servers: int = 1  # neutron-server processes on the same database
    rpc: bool = False  # RabbitMQ + neutron-rpc-server, for Neutron's agents
    deployments: tuple[str, ...] = ("podwire",)  # [ml2_podwire] deployments
    kubernetes: bool = False  # kube-apiserver, kube-controller-manager, kube-scheduler
    kube_bin_dir: Path | None = None  # default: kube_control.default_bin_dir()
    kube_address: str = ""  # the apiserver's advertised address; default: the default route's


class StopRequested(Exception):
    """Raised from the SIGTERM/SIGINT handler to unwind start-up or the wait loop."""


class Stack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.data_dir = options.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def run(self, on_ready: Callable[[dict[str, Any]], None]) -> int:
        """Start everything, call ``on_ready`` with stack.json's content, serve until a signal."""
        _prepare_data_dir(self.data_dir)
        with _exclusive_lock(self.data_dir):
            _clean_stale(self.data_dir)
            previous_signals = install_stop_handlers()
            try:
                info = self._start()
                on_ready(info)
                return self._wait()
            except StopRequested:
                return 0
            finally:
                self._stop_all()
                (self.data_dir / STACK_JSON).unlink(missing_ok=True)
                restore_signal_handlers(previous_signals)

    def _start(self) -> dict[str, Any]:
        started = time.monotonic()
        ports = _previous_ports(self.data_dir)
        kube_bin_dir = self._kube_bin_dir()
        members = self.options.etcd_members
        etcds = etcd_server.cluster(self.data_dir, ports, members)
        endpoints = [member.client_url for member in etcds]
        rabbit = self._start_rabbitmq(ports) if self.options.rpc else None
        mariadb = MariaDB(self.data_dir)
        mariadb.check_paths()
        mariadb.ensure_initialized(self.logs / "mariadb-install.log")
        self._spawn("mariadb", mariadb.argv(self.logs / "mariadb.log"))
        for member in etcds:
            self._spawn(etcd_server.child_name(member, members), member.argv())
        self._wait_ready("mariadb", mariadb.ready)
        mariadb.ensure_database()
        self._ensure_schema(mariadb.url)
        for member in etcds:
            self._wait_ready(etcd_server.child_name(member, members), member.ready)
        server = self._etcd_server_user(endpoints[0])
        plane = self._start_kubernetes(kube_bin_dir, ports, endpoints) if kube_bin_dir else None
        neutron_ports = {
            name: pick_port(ports.get(name, 0)) for name in _neutron_names(self.options)
        }
        transport_url = rabbit.transport_url if rabbit else ""
        etcd_urls = ",".join(endpoints)
        configs = {
            name: self._neutron_config(name, mariadb.url, etcd_urls, server, transport_url)
            for name in neutron_ports
        }
        if rabbit:
            self._spawn_rpc_server(configs["neutron"])
        for name, port in neutron_ports.items():
            self._start_neutron(name, configs[name], port)
        if rabbit:
            self._wait_ready("rabbitmq", rabbit.ready)
            self._wait_ready(RPC_SERVER, lambda: rabbit.consumed(RPC_QUEUES))
        dns_port = None
        if plane:
            self._wait_kubernetes(plane)
            dns_port = self._start_dns(plane, ports)
        neutron_urls = [f"http://127.0.0.1:{port}/" for port in neutron_ports.values()]
        info = {
            "etcd": endpoints[0],
            "etcd_endpoints": endpoints,
            "etcd_auth": server is not None,
            "neutron": neutron_urls[0],
            "neutron_servers": neutron_urls,
            **({"transport_url": rabbit.transport_url} if rabbit else {}),
            **(_kube_entries(plane) if plane else {}),
            **({"cluster_dns": kube_dns.DNS_SERVICE_IP} if dns_port else {}),
            "data_dir": str(self.data_dir),
            "ports": {
                **etcd_server.port_entries(etcds),
                **neutron_ports,
                **(_rabbitmq_ports(rabbit) if rabbit else {}),
                **(_kube_ports(plane) if plane else {}),
                **({kube_dns.COREDNS: dns_port} if dns_port else {}),
            },
            "pids": {"supervisor": os.getpid(), **{n: p.pid for n, p in self.children.items()}},
            "cmdlines": {
                "supervisor": procs.cmdline(os.getpid()),
                **{name: procs.cmdline(proc.pid) for name, proc in self.children.items()},
            },
            "ready_seconds": round(time.monotonic() - started, 2),
        }
        _write_json_atomic(self.data_dir / STACK_JSON, info)
        log.info("stack.ready", data_dir=self.data_dir, seconds=info["ready_seconds"])
        return info

    def _kube_bin_dir(self) -> Path | None:
        """With --kubernetes: where its binaries are, checked before anything starts."""
        if not self.options.kubernetes:
            return None
        if self.options.etcd_auth:
            raise StackError(
                "--kubernetes with --etcd-auth: kube-apiserver authenticates to etcd only with"
                " TLS client certificates, and the stack's etcd takes passwords over loopback"
                " HTTP; use one of the two"
            )
        bin_dir = self.options.kube_bin_dir or kube_control.default_bin_dir()
        kube_control.check_binaries(bin_dir)
        return bin_dir

    def _start_kubernetes(
        self, bin_dir: Path, ports: dict[str, int], etcd_urls: list[str]
    ) -> kube_control.ControlPlane:
        """PKI and kubeconfigs, then the apiserver, which warms up (~5 s) while Neutron
        starts."""
        plane = kube_control.ControlPlane(
            data_dir=self.data_dir,
            bin_dir=bin_dir,
            address=self.options.kube_address or kube_control.advertise_address(),
            apiserver_port=pick_port(ports.get(kube_control.APISERVER, 0)),
            controller_manager_port=pick_port(ports.get(kube_control.CONTROLLER_MANAGER, 0)),
            scheduler_port=pick_port(ports.get(kube_control.SCHEDULER, 0)),
            etcd_urls=tuple(etcd_urls),
        )
        plane.prepare()
        # KILL when the supervisor dies: etcd gets its TERM at the same moment and is gone
        # first, and the apiserver's graceful shutdown then waits for etcd for ever.
        self._spawn(kube_control.APISERVER, plane.apiserver_argv(), death_signal="KILL")
        return plane

    def _start_dns(self, plane: kube_control.ControlPlane, ports: dict[str, int]) -> int | None:
        """CoreDNS and its Service, when scripts/setup built it; None without (logged)."""
        binary = kube_dns.default_binary()
        if not binary.is_file():
            log.warning("stack.dns_skipped", reason=f"no CoreDNS at {binary}: run scripts/setup")
            return None
        port = pick_port(ports.get(kube_dns.COREDNS, 0))
        ready_port, health_port = free_port(), free_port()
        corefile = plane.root / "Corefile"
        kube_dns.write_corefile(corefile, plane.admin_kubeconfig, port, ready_port, health_port)
        self._spawn(kube_dns.COREDNS, kube_dns.argv(binary, corefile))
        self._wait_ready(
            kube_dns.COREDNS, functools.partial(http_ok, f"http://127.0.0.1:{ready_port}/ready")
        )
        context = kube_api.admin_context(plane.pki)
        kube_api.ensure(
            plane.url,
            context,
            "/api/v1/namespaces/kube-system/services",
            "kube-dns",
            kube_dns.service(),
        )
        kube_api.put(
            plane.url,
            context,
            "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/kube-dns-stack",
            kube_dns.endpoint_slice(plane.address, port),
        )
        return port

    def _wait_kubernetes(self, plane: kube_control.ControlPlane) -> None:
        """The controller manager and the scheduler start once the apiserver is ready: before
        its RBAC bootstrap policy is in, their delegated authentication is refused and they
        exit."""
        context = kube_api.admin_context(plane.pki)
        self._wait_ready(kube_control.APISERVER, lambda: kube_api.ready(plane.url, context))
        kube_api.grant_kubelet_client(plane.url, context)
        self._spawn(kube_control.CONTROLLER_MANAGER, plane.controller_manager_argv())
        self._spawn(kube_control.SCHEDULER, plane.scheduler_argv())
        for name, port in _kube_ports(plane).items():
            if name != kube_control.APISERVER:
                self._wait_ready(name, functools.partial(kube_api.healthy, port))

    def _start_rabbitmq(self, ports: dict[str, int]) -> RabbitMQ:
        """epmd, then the broker, which boots (~10 s) while the rest of the stack starts."""
        rabbit = RabbitMQ(
            self.data_dir,
            amqp_port=pick_port(ports.get("rabbitmq", 0)),
            dist_port=pick_port(ports.get("rabbitmq_dist", 0)),
            epmd_port=pick_port(ports.get("epmd", 0)),
        )
        rabbit.prepare()
        env = {**os.environ, **rabbit.environ()}
        self._spawn("epmd", rabbit.epmd_argv(), env=env, user="rabbitmq")
        self._wait_ready("epmd", rabbit.epmd_ready)
        self._spawn("rabbitmq", rabbit.argv(), env=env, user="rabbitmq")
        return rabbit

    def _spawn_rpc_server(self, config: NeutronConfig) -> None:
        """neutron-rpc-server on the first server's config: the WSGI app starts no RPC workers."""
        binary = Path(sys.executable).parent / "neutron-rpc-server"
        if not binary.exists():
            raise StackError(f"{binary} not found: the neutron package is not installed here")
        argv = [str(binary), *config.config_args(), "--log-file", str(self.logs / "rpc-server.log")]
        self._spawn(RPC_SERVER, argv)

    def _etcd_server_user(self, etcd_url: str) -> etcd_auth.Credentials | None:
        """With --etcd-auth: auth on, and the user neutron-server's ml2 driver runs as."""
        if self.options.etcd_auth:
            return etcd_auth.prepare(etcd_url, self.data_dir, self.options.deployments)
        if etcd_auth.SecretStore(self.data_dir).load(ROOT_USER) is not None:
            raise StackError(
                f"the etcd in {self.data_dir} has authentication enabled: add --etcd-auth"
            )
        return None

    def _neutron_config(
        self,
        name: str,
        db_url: str,
        etcd_url: str,
        server: etcd_auth.Credentials | None,
        transport_url: str,
    ) -> NeutronConfig:
        """One neutron-server's (``neutron``, ``neutron-2``, ...) files: its own config dir,
        state, log and ``host`` (the forwarder's identity), the same database and etcd."""
        config = NeutronConfig(
            config_dir=self.data_dir / name.replace("neutron", "neutron-etc", 1),
            state_path=self.data_dir / name,
            log_file=self.logs / f"{name}.log",
            db_url=db_url,
            etcd_url=etcd_url,
            workers=self.options.workers,
            host="podwire-stack" if name == "neutron" else f"podwire-stack-{name}",
            etcd_user=server.user if server else "",
            etcd_password=server.password if server else "",
            transport_url=transport_url,
            deployments=self.options.deployments,
        )
        config.write()
        return config

    def _start_neutron(self, name: str, config: NeutronConfig, port: int) -> None:
        argv = [
            sys.executable, "-m", "gunicorn",
            "--no-control-socket",
            "--workers", str(self.options.workers),
            "--bind", f"127.0.0.1:{port}",
            "--pid", str(self.data_dir / f"{name}.pid"),
            "--timeout", "300",
            "--graceful-timeout", "5",
            "podwire.stack.neutron_wsgi:application",
        ]  # fmt: skip
        self._spawn(name, argv, env={**os.environ, **config.environ()})
        self._wait_ready(name, lambda: http_ok(f"http://127.0.0.1:{port}/", timeout=5))

    def _ensure_schema(self, db_url: str) -> None:
        marker = self.data_dir / SCHEMA_MARKER
        if marker.exists():
            return
        log_path = self.logs / "neutron-schema.log"
        with log_path.open("ab") as log_file:
            result = subprocess.run(
                [sys.executable, "-m", "podwire.stack.neutron_schema", db_url],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            raise StackError(f"creating the Neutron schema failed; see {log_path}")
        marker.touch()

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        user: str | None = None,
        death_signal: str = "TERM",
    ) -> None:
        log.info("stack.start", service=name)
        self.children[name] = procs.spawn(
            argv, self.logs / f"{name}.out", env, user, death_signal=death_signal
        )

    def _wait_ready(self, name: str, check: Callable[[], bool]) -> None:
        proc = self.children[name]
        wait_until(check, name, self.options.ready_timeout, alive=lambda: proc.poll() is None)

    def _wait(self) -> int:
        """Serve until a service is gone: every etcd member, every neutron-server, MariaDB, or
        (with --rpc) the broker, its epmd or the RPC server.

        One member or server of several may die (a failover test kills them): that is logged
        and the rest keeps serving.
        """
        reported: set[str] = set()
        while True:
            for name, proc in self.children.items():
                if proc.poll() is not None and name not in reported:
                    reported.add(name)
                    log.error("stack.child_exited", service=name, code=proc.returncode)
            for kind in STOP_ORDER:
                kin = [name for name in self.children if _kind(name) == kind]
                if kin and all(name in reported for name in kin):
                    return 1
            time.sleep(0.5)

    def _stop_all(self) -> None:
        for kind in STOP_ORDER:
            for name in [n for n in self.children if _kind(n) == kind]:
                proc = self.children.pop(name)
                procs.stop_child(proc, timeout=30)
                log.info("stack.stopped", service=name)


def _kind(child: str) -> str:
    """``etcd-2`` -> ``etcd``, ``neutron-2`` -> ``neutron``, ``rpc-server`` -> ``rpc``; a
    Kubernetes component is its own kind."""
    return child if child in kube_control.COMPONENTS else child.split("-", 1)[0]


def _stop_rank(child: str) -> int:
    kind = _kind(child)
    return STOP_ORDER.index(kind) if kind in STOP_ORDER else len(STOP_ORDER)


def _rabbitmq_ports(rabbit: RabbitMQ) -> dict[str, int]:
    return {
        "rabbitmq": rabbit.amqp_port,
        "rabbitmq_dist": rabbit.dist_port,
        "epmd": rabbit.epmd_port,
    }


def _kube_ports(plane: kube_control.ControlPlane) -> dict[str, int]:
    return {
        kube_control.APISERVER: plane.apiserver_port,
        kube_control.CONTROLLER_MANAGER: plane.controller_manager_port,
        kube_control.SCHEDULER: plane.scheduler_port,
    }


def _kube_entries(plane: kube_control.ControlPlane) -> dict[str, str]:
    return {
        "kube_apiserver": plane.url,
        "kubeconfig": str(plane.admin_kubeconfig),
        "kube_bin_dir": str(plane.bin_dir),
    }


def _neutron_names(options: StackOptions) -> list[str]:
    return ["neutron", *(f"neutron-{i}" for i in range(2, options.neutron_servers + 1))]


def stack_down(data_dir: Path, timeout: float = 60.0) -> bool:
    """Stop the stack running on ``data_dir``; False if none was running."""
    data_dir = data_dir.resolve()
    info = read_stack_json(data_dir)
    if info is None:
        return False
    pids: dict[str, int] = info.get("pids", {})
    cmdlines: dict[str, str] = info.get("cmdlines", {})
    supervisor = pids.get("supervisor", 0)
    if procs.is_ours(supervisor, cmdlines.get("supervisor", "\0")):
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while procs.is_ours(supervisor, cmdlines["supervisor"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    _clean_stale(data_dir)
    return True


def read_stack_json(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / STACK_JSON
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _clean_stale(data_dir: Path) -> None:
    """Stop children a crashed supervisor left behind, then forget its stack.json."""
    info = read_stack_json(data_dir)
    if info is None:
        return
    cmdlines: dict[str, str] = info.get("cmdlines", {})
    pids: dict[str, int] = info.get("pids", {})
    for name in sorted(pids, key=_stop_rank):
        pid = pids[name]
        if name != "supervisor" and procs.terminate(pid, cmdlines.get(name, "\0"), timeout=30):
            log.warning("stack.stale_child_stopped", service=name, pid=pid)
    (data_dir / STACK_JSON).unlink(missing_ok=True)


def _previous_ports(data_dir: Path) -> dict[str, int]:
    path = data_dir / "ports.json"
    try:
        ports = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in ports.items() if isinstance(v, int)} if isinstance(ports, dict) else {}


def _prepare_data_dir(data_dir: Path) -> None:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "logs").mkdir(exist_ok=True)
        probe = data_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise StackError(f"data dir {data_dir} is not writable: {exc.strerror}") from exc


@contextmanager
def _exclusive_lock(data_dir: Path) -> Iterator[IO[str]]:
    handle = (data_dir / "stack.lock").open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            info = read_stack_json(data_dir) or {}
            pid = info.get("pids", {}).get("supervisor", "?")
            raise StackError(
                f"a stack is already running on {data_dir} (pid {pid});"
                f" stop it with: podwire stack down --data-dir {data_dir}"
            ) from exc
        yield handle
    finally:
        handle.close()


def _write_json_atomic(path: Path, content: dict[str, Any]) -> None:
    atomic_write(path, (json.dumps(content, indent=2) + "\n").encode(), 0o644)
    ports_path = path.parent / "ports.json"
    ports_path.write_text(json.dumps(content["ports"]) + "\n")


def _raise_stop(signum: int, frame: object) -> None:
    raise StopRequested(signal.Signals(signum).name)


def install_stop_handlers() -> dict[int, Any]:
    """SIGTERM and SIGINT raise ``StopRequested`` in the main thread."""
    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, _raise_stop)
    return previous


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
