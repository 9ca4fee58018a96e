"""The agent's side of memif: a port of its own per memif, whose frames the node's
``podwire-memif`` master (not the agent) serves on the grant's socket.

A pod that holds a ``podwire.io/memif`` grant gets, at CNI ADD, a second VIF from the VIF
source (attachment ``<container>:memif0``, same network, project and security groups), wired
by the binder like any port. Its host end is a tap on the network's bridge (``pwt`` + digest,
marked like a veth), so the bridge and VXLAN treat it as one more port; the tap's frames are
those of a ``podwire-memif`` master serving the grant's socket. The pod learns its addresses
from ``<grant dir>/memif.json``. The port filter (security groups, anti-spoofing) is told of
the port, keyed on the tap's name, before the tap exists, exactly as for a veth: a restarted
master's tap comes back under the same name and is filtered from its first frame.

One master process serves every memif of the node (``podwire.memif.master``); it outlives the
agent. A supervision loop restarts it when it died (every memif is added again), adds a port it
lost, tears a memif down when its grant's dir is gone (kubelet released the grant), and keeps
each port on the path Neutron allows. Two memif ports of one network exchange frames ring to
ring inside the master (the shared path) when each is either unfiltered (port security off, no
security groups) or filtered by the master itself: the policy enforcer compiles such a port's
security groups and port security into a classifier in the same pass as its nftables rules and
hands it over here (``install``); the master confirms it before the pass counts as in force.
A port whose classifier the master cannot take (too large, refused) goes through its tap,
filtered by the kernel, as any other frame does. A port that leaves the shared path has its
rules put in force first, then the master is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from podwire.agent import naming
from podwire.agent.cni.request import CniRequest
from podwire.agent.metrics import AgentMetrics
from podwire.agent.ports import checkpoint as checkpoints
from podwire.agent.ports.attach import Attacher, Gate, gate_open
from podwire.agent.ports.memif_classifiers import PortClassifiers, Pushed
from podwire.agent.vifs.vifsource import VifSource, vif_request
from podwire.config import MemifSettings
from podwire.deviceplugin import MemifInfo
from podwire.errors import PodwireError
from podwire.files import atomic_write
from podwire.log import get_logger
from podwire.memif import master as memif_master
from podwire.netlink import HostNetlink, Netlink
from podwire.schema import fields
from podwire.schema.checkpoints import MemifEntry
from podwire.schema.nodes import MAX_WHY, MemifPortState
from podwire.schema.ports import DesiredPort
from podwire.schema.vif import Vif

log = get_logger(__name__)

MEMIF_IFNAME = "memif0"  # the memif port's attachment: <container id>:memif0

INFO_FILE = "memif.json"
GRANT_LOOKUP_TIMEOUT = 5.0
SUPERVISE_INTERVAL = 1.0
PATH_RULES_TIMEOUT = 5.0  # a port leaving the shared path waits this long for its rules

PUBLISH_INTERVAL = 2.0  # at most this often to etcd while counters move; a path change at once

PodGrants = Callable[[str, str], Awaitable[list[MemifInfo]]]
# Puts what ``podwire status`` shows of this node's memif ports (the agent's etcd key).
Publish = Callable[[list[MemifPortState]], Awaitable[None]]


@dataclass(frozen=True)
class MemifPlan:
    """What ``attach`` needs from the ADD: the pod's request (its attachment is the key the
    memif is recorded under) and the ADD's deadline."""

    req: CniRequest
    deadline: float


class MemifService:
    def __init__(
        self,
        settings: MemifSettings,
        binary: Path,
        grants: PodGrants,
        vifs: VifSource,
        attacher: Attacher,
        host_nl: HostNetlink,
        state_dir: str,
        metrics: AgentMetrics | None = None,
        publish: Publish | None = None,
        classifies: bool = False,
    ) -> None:
        self._settings = settings
        self._metrics = metrics or AgentMetrics()
        self._binary = binary
        self._grants = grants
        self._vifs = vifs
        self._attacher = attacher
        self._host = host_nl
        self.checkpoint = checkpoints.memifs(state_dir)
        self._lock = asyncio.Lock()
        self._control_path = str(Path(state_dir) / memif_master.CONTROL_FILE)
        self._control = memif_master.MasterControl(self._control_path)
        self._master = (0, 0)  # pid and start time of the node's master
        self._wake = asyncio.Event()
        self.stats: dict[str, memif_master.PortStats] = {}  # by tap, as of the last pass
        self._publish = publish
        self._published: tuple[list[MemifPortState], float] | None = None
        # Whether the policy enforcer compiles classifiers for these ports (security groups
        # enforced on the node): then a filtered port's path waits for its first one.
        self._classifies = classifies
        self.classifiers = PortClassifiers(self._control)

    # -- ADD / DEL -----------------------------------------------------------------------

    def get(self, attachment: str) -> MemifEntry | None:
        return self.checkpoint.entries.get(attachment)

    def vif_attachments(self) -> set[str]:
        return {e.vif_attachment for e in self.checkpoint.entries.values()}

    async def attach(self, plan: MemifPlan) -> MemifEntry | None:
        """Give the pod its memif if it holds a grant; None when it holds none, or when the
        device plugin cannot say (that must never fail a veth pod's ADD)."""
        req = plan.req
        if req.pod is None:
            return None
        existing = self.get(req.attachment)
        if existing is not None:
            return existing
        grant = await self._grant_of(req.pod.namespace, req.pod.name)
        if grant is None:
            return None
        served = [e for e in self.checkpoint.entries.values() if e.socket == grant.host_socket]
        if served:  # a pod on several networks: its one memif is on the first
            log.info("agent.memif.already_served", attachment=req.attachment,
                     by=served[0].attachment)  # fmt: skip
            return None
        vif_attachment = fields.attachment_id(req.container_id, MEMIF_IFNAME)
        vif = await self._vifs.request(vif_request(req, vif_attachment), plan.deadline)
        try:
            entry = await self._wire(req, grant, vif_attachment, vif, plan.deadline)
        except BaseException:
            await self._vifs.release(vif_attachment, vif)
            raise
        log.info(
            "agent.memif.attached",
            attachment=req.attachment,
            port=vif.port_id,
            socket=entry.socket,
            tap=entry.tap,
            pid=entry.pid,
        )
        return entry

    async def _grant_of(self, namespace: str, name: str) -> MemifInfo | None:
        try:
            async with asyncio.timeout(GRANT_LOOKUP_TIMEOUT):
                grants = await self._grants(namespace, name)
        except (PodwireError, TimeoutError) as exc:
            log.warning(
                "agent.memif.grant_lookup_failed",
                pod=f"{namespace}/{name}",
                error=str(exc) or "timed out",
                action="ADD goes on without memif",
            )
            return None
        if len(grants) > 1:
            log.warning("agent.memif.extra_grants", pod=f"{namespace}/{name}", served=1)
        return grants[0] if grants else None

    async def _wire(
        self, req: CniRequest, grant: MemifInfo, vif_attachment: str, vif: Vif, deadline: float
    ) -> MemifEntry:
        wiring = await self._attacher.wiring(vif, deadline)
        entry = MemifEntry(
            attachment=req.attachment,
            vif_attachment=vif_attachment,
            pod={"namespace": req.pod.namespace, "name": req.pod.name} if req.pod else {},
            vif=vif,
            host_dir=grant.host_dir,
            socket=grant.host_socket,
            container_socket=grant.container_socket,
            secret=grant.secret,
            tap=naming.memif_tap(vif_attachment),
            bridge=wiring.bridge,
            mtu=wiring.mtu,
            addresses=wiring.addresses,
        )
        # Keyed on the tap's name: in force before the master makes it.
        return await self._attacher.attach(
            wiring.port, entry.tap, lambda gate: self._serve(entry, gate), deadline
        )

    async def _serve(self, entry: MemifEntry, gate: Gate | None) -> MemifEntry:
        await gate_open(gate)
        await asyncio.to_thread(_write_info, entry)
        # Under the lock until the entry is recorded: a supervision pass in between found no
        # memif, stopped the master it had just started, and the ADD met a refused socket.
        async with self._lock:
            try:
                entry = await self._start(entry)
            except BaseException:
                await asyncio.to_thread(_remove_files, entry)
                raise
            try:
                await self.checkpoint.put(entry)
            except BaseException:
                await self._stop(entry)
                raise
        self._metrics.memifs.set(len(self.checkpoint.entries))
        return entry

    async def detach(self, attachment: str) -> bool:
        """Stop the master (its tap goes with it), remove socket and memif.json, release the
        port. Idempotent; False when the attachment had no memif."""
        async with self._lock:
            return await self._detach(attachment)

    async def _detach(self, attachment: str) -> bool:
        entry = self.get(attachment)
        if entry is None:
            return False
        await self._stop(entry)
        self._attacher.forget(entry.vif.port_id)
        self.classifiers.forget(entry.tap)
        await self._vifs.release(entry.vif_attachment, entry.vif)
        await self.checkpoint.remove(attachment)
        self._metrics.memifs.set(len(self.checkpoint.entries))
        log.info("agent.memif.detached", attachment=attachment, port=entry.vif.port_id)
        await self._stop_master_if_idle()
        return True

    # -- the master process --------------------------------------------------------------

    async def _start(self, entry: MemifEntry) -> MemifEntry:
        master = await self._ensure_master()
        await self._add_port(entry)
        return entry.with_process(*master)

    async def _ensure_master(self) -> tuple[int, int]:
        if not memif_master.is_running(*self._master):
            self._control.close()
            self._master = await asyncio.to_thread(
                memif_master.spawn, self._binary, self._control_path, self._settings
            )
            log.info("agent.memif.master_started", pid=self._master[0])
        return self._master

    async def _add_port(self, entry: MemifEntry) -> None:
        await self._host.run(_remove_own_tap, entry.tap)
        fd = await self._host.run(Netlink.open_tap, entry.tap, entry.mtu, entry.bridge, naming.MARK)
        self.classifiers.forget_confirmed(entry.tap)  # a port added is unfiltered in the master
        shared = self._wants_shared(entry)
        spec = memif_master.PortSpec(
            entry.tap, entry.socket, entry.secret, entry.bridge, shared, entry.vif.mac_address
        )
        await asyncio.to_thread(self._control.add, spec, fd)
        await self._apply_filter(entry)
        if not shared:
            await self._switch(entry, True)

    async def _stop(self, entry: MemifEntry) -> None:
        if memif_master.is_running(*self._master):
            await asyncio.to_thread(self._control.remove, entry.tap)
        await self._host.run(_remove_own_tap, entry.tap)
        await asyncio.to_thread(_remove_files, entry)

    async def _stop_master_if_idle(self) -> None:
        """No memif left: the master goes too, so an idle node runs nothing for memif."""
        if self.checkpoint.entries or not memif_master.is_running(*self._master):
            return
        self._control.close()
        await asyncio.to_thread(memif_master.stop, *self._master)
        self._master = (0, 0)
        log.info("agent.memif.master_stopped", reason="no memif left")

    # -- paths ---------------------------------------------------------------------------

    def _wants_shared(self, entry: MemifEntry) -> bool:
        """Ring to ring only for a port Neutron does not filter at all, or whose classifier the
        master has confirmed."""
        port = self._attacher.current(entry.vif.port_id)
        if port is None:
            return False
        return not port.filtered or self.classifiers.confirmed(entry.tap)

    def _entry_of_tap(self, tap: str) -> MemifEntry | None:
        return next((e for e in self.checkpoint.entries.values() if e.tap == tap), None)

    def path_reason(self, tap: str) -> str:
        """Why the port takes its path, for ``podwire status``."""
        entry = self._entry_of_tap(tap)
        port = None if entry is None else self._attacher.current(entry.vif.port_id)
        if port is not None and not port.filtered:
            return "port security off"
        if not self._classifies:
            return "no classifier: security groups are not enforced by this agent"
        return self.classifiers.reason(tap)

    # -- classifiers (``MasterFilters`` for the policy enforcer) ---------------------------

    def filtered_here(self, ifname: str) -> bool:
        return naming.is_memif_tap(ifname)

    async def install(self, ifname: str, blob: bytes | None, why: str) -> None:
        self.classifiers.compile_done(ifname, blob, why)
        entry = self._entry_of_tap(ifname)
        if entry is None:  # the ADD is under way: it installs it, or the next pass does
            self._wake.set()
            return
        await self._apply_filter(entry)
        if self._wants_shared(entry):
            self._wake.set()  # a port the master now filters may go ring to ring

    async def _apply_filter(self, entry: MemifEntry) -> None:
        """The master filters the port as compiled, or the port leaves the shared path (its
        kernel rules are in force already: the enforcer applied them first)."""
        async with self.classifiers.lock:
            if await self.classifiers.push(entry.tap) != Pushed.UNUSABLE:
                return
            if not self._wants_shared(entry):
                await self._set_path(entry, False)

    async def _switch(self, entry: MemifEntry, shared: bool) -> bool:
        """Set the path if it is still the one the port may take; whether it was set."""
        async with self.classifiers.lock:
            if self._wants_shared(entry) != shared:
                return False
            await self._set_path(entry, shared)
            return True

    async def _set_path(self, entry: MemifEntry, shared: bool) -> None:
        await asyncio.to_thread(self._control.set_path, entry.tap, shared)
        served = self.stats.get(entry.tap)
        if served is None or served.shared != shared:
            log.info("agent.memif.path", attachment=entry.attachment, port=entry.vif.port_id,
                     path="shared" if shared else "kernel")  # fmt: skip

    def port_changed(self, port_id: str, port: DesiredPort) -> None:
        """A wired port's desired value changed: re-check its path now, not at the next pass."""
        del port
        if any(e.vif.port_id == port_id for e in self.checkpoint.entries.values()):
            self._wake.set()

    async def _sync_path(self, entry: MemifEntry, served: memif_master.PortStats) -> bool:
        """Tell the master the path Neutron allows now; whether it had to be told."""
        port = self._attacher.current(entry.vif.port_id)
        if port is None:
            return False
        if self._classifies and port.filtered and entry.tap not in self.classifiers.compiled:
            # After an agent start the master still filters as it was told before; the
            # enforcer's first pass (which the ADDs wait for too) decides.
            return False
        shared = self._wants_shared(entry)
        if served.shared == shared:
            return False
        if not shared:
            # Its rules first: once the master answers, its frames go through the filter.
            await self._attacher.enforce(port, entry.tap, PATH_RULES_TIMEOUT)
        return await self._switch(entry, shared)

    # -- restart and supervision ---------------------------------------------------------

    async def restore(self) -> None:
        """After an agent start: adopt the running master, start it again when it died, drop
        memifs whose grant is gone. Called once the binder has adopted the bridges."""
        self.checkpoint.load()
        for entry in self.checkpoint.entries.values():
            if memif_master.is_running(entry.pid, entry.started):
                self._master = (entry.pid, entry.started)
                break
        adopted = await self.supervise_once()
        self._metrics.memifs.set(len(self.checkpoint.entries))
        log.info("agent.memif.restored", memifs=len(self.checkpoint.entries), adopted=adopted)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUPERVISE_INTERVAL):
                    await self._wake.wait()
            self._wake.clear()
            await self.supervise_once()

    async def supervise_once(self) -> int:
        """One pass over every memif; returns how many ports the master was found serving."""
        async with self._lock:
            try:
                return await self._supervise()
            except PodwireError as exc:
                log.warning("agent.memif.supervise_failed", error=str(exc))
                return 0

    async def _supervise(self) -> int:
        for entry in list(self.checkpoint.entries.values()):
            if not await asyncio.to_thread(os.path.isdir, entry.host_dir):
                log.info("agent.memif.grant_gone", attachment=entry.attachment, dir=entry.host_dir)
                await self._detach(entry.attachment)
        if not self.checkpoint.entries:
            await self._stop_master_if_idle()
            self.stats = {}
            await self._publish_state({})
            return 0
        await self._restart_dead_master()
        served = await asyncio.to_thread(self._served_now)
        found, changed = len(served), False
        for entry in list(self.checkpoint.entries.values()):
            try:
                changed |= await self._keep(entry, served)
            except PodwireError as exc:
                log.warning("agent.memif.port_failed", attachment=entry.attachment, error=str(exc))
        self.stats = await asyncio.to_thread(self._served_now) if changed else served
        ids = self._port_ids()
        self._metrics.observe_memifs(self.stats, ids)
        await self._publish_state(ids)
        return found

    async def _restart_dead_master(self) -> None:
        if memif_master.is_running(*self._master):
            return
        old = self._master[0] or next(iter(self.checkpoint.entries.values())).pid
        self.classifiers.forget_confirmed()
        await self._ensure_master()
        log.warning("agent.memif.master_restarted", old_pid=old, new_pid=self._master[0])
        self._metrics.memif_master_restarts.inc()

    async def _keep(self, entry: MemifEntry, served: dict[str, memif_master.PortStats]) -> bool:
        """The port served on the path Neutron allows; whether the master had to be told."""
        port = served.get(entry.tap)
        if port is None:
            log.info("agent.memif.port_added", attachment=entry.attachment, tap=entry.tap)
            await self._add_port(entry)
            await self.checkpoint.put(entry.with_process(*self._master))
            return True
        if self.classifiers.filtered_in_master(entry.tap) and not port.filtered:
            log.warning("agent.memif.classifier_lost", tap=entry.tap)
            self.classifiers.forget_confirmed(entry.tap)
        if self.classifiers.pending(entry.tap):
            await self._apply_filter(entry)
        return await self._sync_path(entry, port)

    def served(self) -> dict[str, memif_master.PortStats]:
        """What the master serves now, by tap (blocking: a few microseconds of control
        socket; for status and tests)."""
        if not memif_master.is_running(*self._master):
            return {}
        return self._served_now()

    def _served_now(self) -> dict[str, memif_master.PortStats]:
        return {s.name: s for s in self._control.ports()}

    async def _publish_state(self, ids: dict[str, str]) -> None:
        if self._publish is None:
            return
        ports = [
            _port_state(ids[tap], s, self.path_reason(tap))
            for tap, s in sorted(self.stats.items())
            if tap in ids
        ]
        now = time.monotonic()
        if self._published is not None:
            last, at = self._published
            if ports == last or (_shape(ports) == _shape(last) and now - at < PUBLISH_INTERVAL):
                return
        try:
            await self._publish(ports)
        except PodwireError as exc:
            log.warning("agent.memif.publish_failed", error=str(exc))
            return
        self._published = (ports, now)

    def _port_ids(self) -> dict[str, str]:
        return {e.tap: e.vif.port_id for e in self.checkpoint.entries.values()}


def _port_state(port_id: str, s: memif_master.PortStats, why: str) -> MemifPortState:
    return MemifPortState(
        port_id, s.name, s.path, s.connected, s.from_client, s.to_client, s.to_kernel,
        s.to_shared, s.drops, s.ring_full, why[:MAX_WHY], s.admitted, s.spoofed, s.denied,
        s.invalid, s.flows_full,
    )  # fmt: skip


def _shape(ports: list[MemifPortState]) -> list[tuple[str, str, bool]]:
    """What must reach ``podwire status`` at once when it changes: ports, paths, clients."""
    return [(p.tap, p.path, p.connected) for p in ports]


def _write_info(entry: MemifEntry) -> None:
    """``memif.json`` in the grant dir: what the CNF needs to configure its memif."""
    gateway = next((a.gateway for a in entry.addresses if a.gateway), None)
    body = {
        "mac": entry.vif.mac_address,
        "ips": [a.address for a in entry.addresses],
        "gateway": gateway,
        "mtu": entry.mtu,
        "port_id": entry.vif.port_id,
        "socket": entry.container_socket,
    }
    atomic_write(Path(entry.host_dir) / INFO_FILE, json.dumps(body).encode(), 0o644)


def _remove_files(entry: MemifEntry) -> None:
    memif_master.remove_socket(entry.socket)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(entry.host_dir) / INFO_FILE)


def _remove_own_tap(nl: Netlink, name: str) -> bool:
    """A tap left by a master that was killed hard goes with it; this catches a tap whose
    master is still tearing down, and never removes a link without podwire's mark."""
    found = nl.link(name)
    if found is None:
        return False
    if not naming.is_marked(found.alias):
        log.warning("agent.memif.foreign_tap_left_alone", interface=name)
        return False
    return nl.remove_link(name)
