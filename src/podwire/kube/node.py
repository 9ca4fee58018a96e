"""``podwire kube-node``: a Kubernetes node for one simulated host of the local stack.

A private containerd and a real kubelet, registered as Node HOST with the stack's apiserver,
with podwire's conflist in containerd's CNI conf dir: pods the API puts on HOST get their
ports from the host's podwire agent. Everything lives under ``DIR/kube-nodes/HOST``; the link
to the apiserver (``apilink``), the node's shared mount (``mounts``), containerd and kubelet
are each undone, in reverse order, when the node stops (SIGTERM, SIGINT): kubelet first, then
every pod sandbox through the CRI (each pod's CNI DEL returns its port), then containerd and
its mounts, kubelet's mounts, the link. kubelet or containerd ending meanwhile is started
again. One kube-node per host and data dir (a lock file says so); a run that was killed is
cleaned up by the next.
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire.backoff import Backoff
from podwire.cni.install import InstallSpec, install
from podwire.errors import KubeError
from podwire.kube import apilink, cnf, leftovers, mounts, node_api, node_pki, sandboxes, stackinfo
from podwire.kube.containerd import Containerd, check_installed
from podwire.kube.images import build_pause_archive, build_toolbox_archive
from podwire.kube.kubelet import KubeletFiles, argv, configuration, write_configuration
from podwire.log import get_logger
from podwire.netlink import is_netns, netns_path
from podwire.stack import kube_api, kubeconfig, procs
from podwire.stack.runner import StopRequested, install_stop_handlers, restore_signal_handlers

log = get_logger(__name__)

NODES_DIR = "kube-nodes"
# A Node's name is a DNS subdomain (RFC 1123): lower case, digits, '-' and '.'.
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class NodeOptions:
    data_dir: Path
    host: str
    netns: str
    agent_socket: str
    network: str
    project: str = ""
    security_groups: tuple[str, ...] = ()
    node_ip: str = ""  # default: the namespace's first global IPv4 address
    ready_timeout: float = 120.0


def node_dir(data_dir: Path, host: str) -> Path:
    return data_dir / NODES_DIR / host


class KubeNode:
    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.dir = node_dir(options.data_dir.resolve(), options.host)
        self.files = KubeletFiles(self.dir)
        self.containerd = Containerd(
            self.dir / "containerd", netns=options.netns, log_dir=self.dir / "logs"
        )
        self.kubelet: subprocess.Popen[bytes] | None = None
        self._kubelet_argv: list[str] = []

    def run(self, announce: Callable[[dict[str, Any]], None]) -> int:
        """Serve until a signal (0); an error during start-up (or a restart that fails) is
        raised after the teardown."""
        facts = self._check()
        self.dir.mkdir(parents=True, exist_ok=True)
        with _node_lock(self.dir, self.options.host):
            leftovers.clean(self.dir, self.files, self.containerd)
            previous = install_stop_handlers()
            try:
                with ExitStack() as undo:
                    try:
                        announce(self._start(facts, undo))
                        return self._serve()
                    except StopRequested:
                        return 0
                    finally:
                        _hold_stop_signals()  # the teardown runs to its end
            finally:
                restore_signal_handlers(previous)

    def _check(self) -> stackinfo.StackFacts:
        host, netns = self.options.host, self.options.netns
        if len(host) > 253 or not NODE_NAME.match(host):
            raise KubeError(
                f"--host {host!r}: a Node name is lower case letters, digits, '-' and '.'"
            )
        if not is_netns(netns_path(netns)):
            raise KubeError(f"--netns: no network namespace named {netns}")
        if self.options.node_ip and not _is_ipv4(self.options.node_ip):
            raise KubeError(f"--node-ip {self.options.node_ip!r}: not an IPv4 address")
        check_installed()
        return stackinfo.read(self.options.data_dir.resolve())

    def _start(self, facts: stackinfo.StackFacts, undo: ExitStack) -> dict[str, Any]:
        """Each part's undo is registered before the next part starts: the teardown runs them
        in reverse, so kubelet is gone before the sandboxes are removed, and those before
        containerd stops."""
        started = time.monotonic()
        node_ip = self.options.node_ip or apilink.host_address(self.options.netns)
        link = apilink.ApiLink(self.options.netns, node_ip, facts.api_ip)
        link.check_free()  # before its undo is registered: another node's link stays
        undo.callback(leftovers.forget_link, self.dir, link)
        leftovers.remember_link(self.dir, link)
        link.create()
        undo.callback(self._unmount)
        mounts.share(self.dir)
        undo.callback(self.containerd.cleanup)
        self._start_containerd()
        undo.callback(self._remove_sandboxes)
        undo.callback(leftovers.forget_tables, self.dir, self.options.netns)
        leftovers.remember_tables(self.dir, self.options.netns)
        since = time.time()
        self._start_kubelet(facts, node_ip)
        undo.callback(self._stop_kubelet)
        self._wait_ready(facts, since)
        return self._announcement(node_ip, time.monotonic() - started)

    def _start_containerd(self) -> None:
        """containerd with the offline images and podwire's conflist for this host."""
        self.containerd.prepare()
        self.containerd.start()
        builds = [build_pause_archive, build_toolbox_archive]
        builds += [cnf.build_testpmd_archive] if cnf.available() else []
        for build in builds:
            self.containerd.import_image(build(self.containerd.work))
        spec = InstallSpec(
            bin_dir=self.containerd.bin_dir,
            conf_dir=self.containerd.conf_dir,
            network=self.options.network,
            project=self.options.project,
            security_groups=list(self.options.security_groups),
            agent_socket=self.options.agent_socket,
        )
        install(spec)

    def _start_kubelet(self, facts: stackinfo.StackFacts, node_ip: str) -> None:
        host, files = self.options.host, self.files
        node_pki.ensure(facts.pki, files.pki, host, node_ip)
        identity = node_pki.node_identity(host)
        client = node_pki.client_pair(files.pki)
        kubeconfig.write(
            files.kubeconfig, facts.apiserver, facts.pki.ca.cert, client, identity.name
        )
        for directory in (files.device_plugins, files.container_logs, files.pod_logs):
            directory.mkdir(parents=True, exist_ok=True)
        body = configuration(
            files, self.containerd.socket, node_ip, facts.pki.ca.cert, facts.cluster_dns
        )
        write_configuration(files, body)
        self._kubelet_argv = argv(facts.kubelet, files, host, node_ip, self.options.netns)
        self._spawn_kubelet()

    def _spawn_kubelet(self) -> None:
        self.kubelet = procs.spawn(self._kubelet_argv, self.files.log, new_session=True)
        log.info("kube_node.kubelet_started", host=self.options.host, pid=self.kubelet.pid)

    def _wait_ready(self, facts: stackinfo.StackFacts, since: float) -> None:
        context = kube_api.admin_context(facts.pki)
        deadline = time.monotonic() + self.options.ready_timeout
        backoff = Backoff(0.1, 1.0, factor=1.5)
        while True:
            node = node_api.get_node(facts.apiserver, context, self.options.host)
            ready, why = node_api.ready_condition(node, since)
            if ready:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise KubeError(
                    f"Node {self.options.host} not Ready after {self.options.ready_timeout:.0f}"
                    f" s ({why}); see {self.files.log}"
                )
            time.sleep(backoff.next())

    def _check_alive(self) -> None:
        if self.kubelet is not None and self.kubelet.poll() is not None:
            raise KubeError(f"kubelet exited with {self.kubelet.returncode}; see {self.files.log}")
        if not self.containerd.alive():
            raise KubeError(f"containerd exited; see {self.containerd.log_files[-1]}")

    def _serve(self) -> int:
        """Until a signal. kubelet or containerd that ends is started again, as systemd's
        ``Restart=always`` does on a real node, after a pause that grows while it keeps
        ending: the pods' sandboxes outlive both, so a restart changes no pod's network (and
        a kubelet restart is what makes device plugins register again)."""
        kubelet, containerd = _Restarts("kubelet"), _Restarts("containerd")
        while True:
            time.sleep(0.5)
            if not self.containerd.alive():
                containerd.pause(self.containerd.log_files[-1])
                self.containerd.start()
            if self.kubelet is not None and self.kubelet.poll() is not None:
                kubelet.pause(self.files.log)
                self._spawn_kubelet()

    def _announcement(self, node_ip: str, seconds: float) -> dict[str, Any]:
        return {
            "node": self.options.host,
            "kubeconfig": str(self.files.kubeconfig),
            "kubelet_root": str(self.files.root),
            "node_ip": node_ip,
            "containerd_socket": self.containerd.socket,
            "kubelet_pid": self.kubelet.pid if self.kubelet else 0,
            "ready_seconds": round(seconds, 2),
        }

    def _stop_kubelet(self) -> None:
        if self.kubelet is not None:
            procs.stop_child(self.kubelet, timeout=30)
            log.info("kube_node.kubelet_stopped", host=self.options.host)

    def _remove_sandboxes(self) -> None:
        """Before containerd stops: every pod's CNI DEL through the CRI."""
        if not self.containerd.alive():
            log.error("kube_node.sandboxes_left", host=self.options.host, reason="containerd down")
            return
        failed = sandboxes.remove_all(self.containerd.socket)
        if failed:
            raise KubeError(f"pod sandboxes not removed: {'; '.join(failed)}")

    def _unmount(self) -> None:
        leftovers.unmount_node(self.dir, self.files)


@dataclass
class _Restarts:
    """The pause before one part is started again: doubling from 0.5 s to 10 s while it keeps
    ending, from 0.5 s again once it ran longer than that."""

    part: str
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 10.0))
    since: float = field(default_factory=time.monotonic)

    def pause(self, log_file: Path) -> None:
        if time.monotonic() - self.since > self.backoff.maximum:
            self.backoff.reset()
        delay = self.backoff.next()
        log.warning("kube_node.restart", part=self.part, delay=delay, log=str(log_file))
        time.sleep(delay)
        self.since = time.monotonic()


def _is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def _hold_stop_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


@contextmanager
def _node_lock(directory: Path, host: str) -> Iterator[None]:
    handle = (directory / "kube-node.lock").open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise KubeError(f"a kube-node for host {host} already runs on this stack") from exc
        yield
    finally:
        handle.close()
