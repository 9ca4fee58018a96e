"""The agent's CNI verbs: ADD, DEL, CHECK, VERSION, STATUS, GC (CNI 1.1).

Every failure leaves as a ``CniError`` with the spec's code and a message that says what to
fix. ADD is all-or-nothing: what it created (the veth, a VIF it requested) is removed before
the error goes back. Requests for one attachment are serialised; different attachments run
concurrently.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from podwire.agent import naming
from podwire.agent.cni.request import (
    CniRequest,
    NoSuchAttachment,
    parse_command,
    parse_request,
    valid_attachments,
)
from podwire.agent.cni.result import add_memif, render
from podwire.agent.fabric.binder import PortVanished
from podwire.agent.metrics import AgentMetrics
from podwire.agent.ports.attach import Attacher, addresses_of
from podwire.agent.ports.checkpoint import EntryStore
from podwire.agent.ports.memif import MEMIF_IFNAME, MemifPlan, MemifService
from podwire.agent.ports.veth import Plugger, PlugSpec, PodInterfaceTaken, is_nested, planned
from podwire.agent.services.pods import PodServices
from podwire.agent.vifs.podrelease import PodReleaser
from podwire.agent.vifs.vifsource import VifSource, vif_request
from podwire.cni import spec
from podwire.cni.spec import CniError
from podwire.errors import PermanentError, PodwireError, RetryableError, ValidationError
from podwire.log import get_logger
from podwire.netlink import NotANamespace, host_netns_files, is_netns, same_netns
from podwire.schema import doc, fields
from podwire.schema.checkpoints import Attached, Attachment, MemifEntry
from podwire.schema.vif import Vif

log = get_logger(__name__)

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
# Ports an ADD replaces after they vanished before being wired (deleted or unbound in
# Neutron): more in one ADD means someone is deleting the pool's ports as it hands them out.
MAX_VANISHED = 3
REPAIR_INTERVAL = 1.0  # seconds between looks at the pods' host interfaces


@dataclass(frozen=True)
class HandlerSettings:
    host: str
    add_timeout: float = 60.0
    nested_uplink: str = ""  # nested mode: VIFs with a vlan_id become VLANs of this interface
    host_netns: str = ""  # the host's namespace by name (simulated hosts); "": the agent's own


class CniHandler:
    def __init__(
        self,
        settings: HandlerSettings,
        vifs: VifSource,
        attacher: Attacher,
        plugger: Plugger,
        checkpoint: EntryStore[Attachment],
        ready: ReadyCheck,
        pods: PodReleaser | None = None,
        metrics: AgentMetrics | None = None,
        memif: MemifService | None = None,
        services: PodServices | None = None,
    ) -> None:
        self._settings = settings
        self._services = services
        self._host_namespaces = host_netns_files(settings.host_netns)
        self._memif = memif
        self._metrics = metrics or AgentMetrics()
        self._vifs = vifs
        self._attacher = attacher
        self._plugger = plugger
        self._checkpoint = checkpoint
        self._ready = ready
        self._pods = pods
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}

    async def __call__(self, env: dict[str, str], stdin: str) -> tuple[int, str]:
        command = env.get("CNI_COMMAND", "?")
        started = time.perf_counter()
        try:
            out = await self._handle(env, stdin)
        except CniError as exc:
            self._metrics.cni_requests.labels(command, str(exc.code)).inc()
            log.warning("agent.cni.error", command=command, code=exc.code, msg=exc.msg)
            return exc.code, exc.to_json(_version_of(stdin))
        self._metrics.cni_requests.labels(command, "0").inc()
        self._metrics.cni_seconds.labels(command).observe(time.perf_counter() - started)
        return 0, out

    async def _handle(self, env: dict[str, str], stdin: str) -> str:
        if parse_command(env) == "VERSION":
            return spec.version_result()
        try:
            req = parse_request(env, stdin)
        except NoSuchAttachment as exc:
            log.info("agent.cni.deleted", attachment=None, known=False, reason=exc.msg)
            return ""
        try:
            if req.command == "STATUS":
                return await self._status()
            if req.command == "GC":
                return await self._gc(req)
            async with self._lock(req.attachment):
                if req.command == "ADD":
                    return await self._add(req)
                if req.command == "DEL":
                    return await self._del(req.attachment, req)
                return await self._check(req)
        except CniError:
            raise
        except NotANamespace as exc:
            raise CniError(spec.INVALID_ENV, f"CNI_NETNS: {exc}") from exc
        except PodInterfaceTaken as exc:
            raise CniError(spec.INVALID_ENV, str(exc)) from exc
        except RetryableError as exc:
            raise CniError(spec.TRY_AGAIN, str(exc)) from exc
        except PermanentError as exc:
            raise CniError(spec.INVALID_CONFIG, str(exc)) from exc

    @asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._waiters[key] -= 1
            if not self._waiters[key]:
                del self._waiters[key], self._locks[key]

    # -- ADD -----------------------------------------------------------------------------

    async def _add(self, req: CniRequest) -> str:
        existing = self._checkpoint.get(req.attachment)
        if (
            existing is not None
            and existing.netns == req.netns
            and await self._plugger.check(existing.attached, _bridge(existing.vif)) is None
        ):
            return self._result(req, existing, self._memif_of(req.attachment))
        if not is_netns(req.netns):
            raise CniError(
                spec.INVALID_ENV,
                f"CNI_NETNS {req.netns} does not exist or is not a network namespace",
            )
        if any(same_netns(req.netns, host) for host in self._host_namespaces):
            raise CniError(
                spec.INVALID_ENV,
                f"CNI_NETNS {req.netns} is the host's own network namespace, not a pod's: a"
                " pod (hostNetwork pods included) is never given a podwire port there",
            )
        if req.pod is not None and self._pods is not None:
            self._pods.cancel(req.pod.namespace, req.pod.name)
        deadline = asyncio.get_running_loop().time() + self._settings.add_timeout
        started = time.perf_counter()
        if existing is not None:
            vif = existing.vif
        else:
            vif = await self._vifs.request(vif_request(req, req.attachment), deadline)
        requested = existing is None  # whether this ADD holds the VIF (and releases it)
        got_vif = time.perf_counter()
        try:
            for attempt in range(MAX_VANISHED + 1):
                try:
                    entry = await self._wire(req, vif, deadline)
                    break
                except PortVanished as exc:
                    if attempt == MAX_VANISHED:
                        raise
                    log.info("agent.cni.port_vanished", attachment=req.attachment, error=str(exc))
                    again = vif_request(req, req.attachment, replaces=vif.port_id)
                    vif = await self._vifs.request(again, deadline)
                    requested = True
            memif = await self._memif.attach(MemifPlan(req, deadline)) if self._memif else None
            if self._services is not None:
                await self._services.sync(entry)
        except BaseException:
            self._attacher.forget(vif.port_id)
            await self._rollback(req.attachment, vif if requested else None)
            raise
        log.info(
            "agent.cni.added",
            attachment=req.attachment,
            port=vif.port_id,
            vif_ms=_ms(got_vif - started),  # where a slow ADD's time went, for the operator
            wire_ms=_ms(time.perf_counter() - got_vif),
        )
        return self._result(req, entry, memif)

    def _memif_of(self, attachment: str) -> MemifEntry | None:
        return self._memif.get(attachment) if self._memif else None

    def _result(self, req: CniRequest, entry: Attachment, memif: MemifEntry | None) -> str:
        result = render(entry.attached, req.conf.cni_version, req.conf.prev_result)
        if memif is not None:
            add_memif(result, MEMIF_IFNAME, memif.vif.mac_address, memif.socket, memif.addresses)
        return _dump(result)

    async def _rollback(self, attachment: str, vif: Vif | None) -> None:
        """Undo a failed ADD; a failure here is logged so the original error is what the
        runtime sees (its DEL will retry the release)."""
        try:
            if self._memif is not None:
                await self._memif.detach(attachment)
            await self._plugger.unplug(attachment)
            if vif is not None:
                await self._vifs.release(attachment, vif)
                await self._checkpoint.remove(attachment)
        except PodwireError as exc:
            log.warning("agent.cni.rollback_failed", attachment=attachment, error=str(exc))

    async def _wire(self, req: CniRequest, vif: Vif, deadline: float) -> Attachment:
        uplink = self._settings.nested_uplink
        if uplink and vif.vlan_id is not None:
            return await self._wire_nested(req, vif, uplink, vif.vlan_id)
        where = (req.attachment, req.netns, req.ifname)
        return await self._wire_veth(where, vif, lambda a: self._entry(req, vif, a), deadline)

    async def _wire_veth(
        self,
        where: tuple[str, str, str],
        vif: Vif,
        entry_for: Callable[[Attached], Attachment],
        deadline: float,
    ) -> Attachment:
        """A veth for ``vif`` into the pod (attachment, namespace, interface name), its
        rules in force before its host end comes up, recorded in the checkpoint."""
        attachment, netns, ifname = where
        wiring = await self._attacher.wiring(vif, deadline)
        plug = PlugSpec(
            attachment, netns, ifname, vif.mac_address, wiring.mtu, wiring.bridge,
            wiring.addresses,
        )  # fmt: skip
        entry = entry_for(planned(plug))
        await self._attacher.attach(
            wiring.port,
            naming.host_veth(attachment),
            lambda gate: self._plugged_and_recorded(entry, self._plugger.plug(plug, gate)),
            deadline,
        )
        return entry

    # -- repair --------------------------------------------------------------------------

    async def repair_forever(self, interval: float = REPAIR_INTERVAL) -> None:
        """What a pod was given and someone took (its veth deleted, or taken off the
        bridge) is given again, as Felix repairs what it programmed; counted and logged."""
        while True:
            await asyncio.sleep(interval)
            await self.repair()

    async def repair(self) -> int:
        ports = await self._plugger.host_ports()
        bridges: dict[str, int | None] = {}
        repaired = 0
        for entry in list(self._checkpoint.entries.values()):
            if is_nested(entry.attached):
                continue
            bridge = _bridge(entry.vif)
            if bridge not in bridges:
                bridges[bridge] = await self._plugger.bridge_index(bridge)
            master = ports.get(entry.attached.host_ifname)
            if master is not None and master == bridges[bridge]:
                continue
            repaired += await self._repair_one(entry.attachment)
        return repaired

    async def _repair_one(self, attachment: str) -> int:
        async with self._lock(attachment):  # never under an ADD or DEL of the same pod
            entry = self._checkpoint.get(attachment)
            if entry is None or not is_netns(entry.netns):
                return 0  # deleted meanwhile, or the pod is gone: its DEL or GC comes
            problem = await self._plugger.check(entry.attached, _bridge(entry.vif))
            if problem is None:
                return 0
            deadline = asyncio.get_running_loop().time() + self._settings.add_timeout
            where = (entry.attachment, entry.netns, entry.ifname)
            try:
                await self._plugger.unplug(attachment, entry.attached)
                await self._wire_veth(
                    where, entry.vif, lambda a: replace(entry, attached=a), deadline
                )
            except PodwireError as exc:
                log.warning("agent.cni.repair_failed", attachment=attachment, error=str(exc))
                return 0
        self._metrics.attachment_repairs.inc()
        log.warning("agent.cni.repaired", attachment=attachment, port=entry.vif.port_id,
                    problem=problem)  # fmt: skip
        return 1

    async def _wire_nested(
        self, req: CniRequest, vif: Vif, uplink: str, vlan_id: int
    ) -> Attachment:
        """The subport is wired by the trunk's host (the hypervisor), not by this binder."""
        addresses = addresses_of(vif.fixed_ips)
        plug = PlugSpec(
            req.attachment, req.netns, req.ifname, vif.mac_address, vif.mtu, "", addresses
        )
        entry = self._entry(req, vif, planned(plug, uplink))
        await self._plugged_and_recorded(entry, self._plugger.plug_nested(plug, uplink, vlan_id))
        return entry

    def _entry(self, req: CniRequest, vif: Vif, attached: Attached) -> Attachment:
        return Attachment(
            attachment=req.attachment,
            container_id=req.container_id,
            ifname=req.ifname,
            network_name=req.conf.name,
            netns=req.netns,
            pod=None if req.pod is None else vars(req.pod),
            vif=vif,
            attached=attached,
        )

    async def _plugged_and_recorded(
        self, entry: Attachment, plugging: Coroutine[object, object, Attached]
    ) -> None:
        """The checkpoint write (two fsyncs, about as long as the plug) runs while the pod is
        plugged; the ADD answers only after both. An entry ahead of its interfaces is the safe
        side: a crash in between leaves a record the runtime's retried ADD or its DEL
        completes, never interfaces nobody knows of. A failed plug's entry goes with the
        rollback."""
        recording = asyncio.ensure_future(self._checkpoint.put(entry))
        try:
            await plugging
        except BaseException:
            await asyncio.gather(recording, return_exceptions=True)
            raise
        await recording
        self._metrics.attachments.set(len(self._checkpoint.entries))

    # -- DEL, CHECK, GC, STATUS ----------------------------------------------------------

    async def _del(self, attachment: str, req: CniRequest | None) -> str:
        entry = self._checkpoint.get(attachment)
        if self._memif is not None:
            await self._memif.detach(attachment)
        await self._plugger.unplug(attachment, entry.attached if entry else None)
        if entry is not None:
            # Before the release: the controller may hand the port to this node's next ADD
            # at once, and a forget after that ADD enforced it would drop the new pod's rules.
            self._attacher.forget(entry.vif.port_id)
        await self._vifs.release(attachment, entry.vif if entry else None)
        await self._checkpoint.remove(attachment)
        if self._services is not None:
            self._services.forget(attachment)
        self._metrics.attachments.set(len(self._checkpoint.entries))
        pod = entry.pod if entry else None
        if pod and self._pods is not None and not self._pod_attached(pod):
            self._pods.schedule(pod["namespace"], pod["name"])
        log.info("agent.cni.deleted", attachment=attachment, known=entry is not None)
        return ""

    def _pod_attached(self, pod: dict[str, str]) -> bool:
        return any(
            e.pod
            and e.pod.get("namespace") == pod["namespace"]
            and e.pod.get("name") == pod["name"]
            for e in self._checkpoint.entries.values()
        )

    async def _check(self, req: CniRequest) -> str:
        entry = self._checkpoint.get(req.attachment)
        if entry is None:
            raise CniError(
                spec.CONTAINER_UNKNOWN, f"no podwire attachment {req.attachment}: ADD it first"
            )
        problem = await self._plugger.check(entry.attached, _bridge(entry.vif))
        if problem is None:
            problem = _prev_result_problem(req, entry)
        if problem is not None:
            raise CniError(spec.CHECK_FAILED, f"CHECK {req.attachment}: {problem}")
        return ""

    async def _gc(self, req: CniRequest) -> str:
        keep = valid_attachments(req.conf)
        stale = [
            e.attachment
            for e in list(self._checkpoint.entries.values())
            if e.network_name == req.conf.name and (e.container_id, e.ifname) not in keep
        ]
        for attachment in stale:
            async with self._lock(attachment):
                await self._del(attachment, None)
        orphans = await self._gc_orphans({fields.attachment_id(c, i) for c, i in keep})
        log.info("agent.cni.gc", network=req.conf.name, released=len(stale), orphans=orphans)
        return ""

    async def _gc_orphans(self, keep: set[str]) -> list[str]:
        """Release ports the VIF source holds for attachments neither the runtime (``keep``)
        nor the checkpoint knows: left by an agent crash between the VIF answer and the
        checkpoint write. Checked again under each attachment's lock, so an ADD in flight
        (VIF requested, checkpoint not yet written) is never released under it."""
        released = []
        memif_ports = self._memif.vif_attachments() if self._memif else set()
        for attachment in sorted(await self._vifs.held() - keep - memif_ports):
            async with self._lock(attachment):
                if self._checkpoint.get(attachment) is None:
                    await self._del(attachment, None)
                    released.append(attachment)
        return released

    async def _status(self) -> str:
        ready, detail = await self._ready()
        if not ready:
            raise CniError(spec.NOT_AVAILABLE, f"podwire agent not ready: {detail}")
        return ""


def _bridge(vif: Vif) -> str:
    return naming.bridge(vif.network_id)


def _prev_result_problem(req: CniRequest, entry: Attachment) -> str | None:
    prev = req.conf.prev_result
    if prev is None:
        return None
    for iface in prev.get("interfaces", []):
        if isinstance(iface, dict) and iface.get("name") == entry.ifname:
            return None
    return f"prevResult does not list interface {entry.ifname}"


def _dump(result: dict[str, object]) -> str:
    return json.dumps(result)


def _version_of(stdin: str) -> str:
    try:
        version = doc.decode_object(stdin, "network config").get("cniVersion")
    except ValidationError:
        return spec.LATEST
    return version if version in spec.SUPPORTED_VERSIONS else spec.LATEST


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
