"""The device plugin as one object the agent embeds (or ``podwire device-plugin`` runs).

Two long-running tasks share the grants: the kubelet session (serve, self-check, register,
watch for a kubelet restart, repeat) and reconciliation against the PodResources API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from podwire.backoff import Backoff
from podwire.config import DevicePluginSettings
from podwire.deviceplugin.allocator import MemifAllocator
from podwire.deviceplugin.api import KUBELET_SOCKET
from podwire.deviceplugin.checkpoint import CheckpointCorrupt, CheckpointStore, CheckpointWriteError
from podwire.deviceplugin.model import MemifInfo, PodName, valid_pod_name
from podwire.deviceplugin.podresources import PodResourcesClient
from podwire.deviceplugin.reconcile import ReconcilePlan
from podwire.deviceplugin.registration import register
from podwire.deviceplugin.server import MAX_SOCKET_PATH, DevicePluginService, PluginEndpoint
from podwire.deviceplugin.stats import Stats
from podwire.deviceplugin.watcher import KubeletRestartWatcher
from podwire.errors import ConfigError, PodwireError, RetryableError, ValidationError
from podwire.log import get_logger

log = get_logger(__name__)

# Settings that can change while running; every other one is baked into sockets, dirs or the
# checkpoint.
RELOADABLE = frozenset({"devices", "enabled"})


def socket_name(resource_name: str) -> str:
    short = resource_name.rpartition("/")[2]
    return f"podwire-{''.join(c if c.isalnum() or c in '-_.' else '-' for c in short)}.sock"


class DevicePlugin:
    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        reconcile_interval: float = 30.0,
        reconcile_grace: float = 60.0,
        watch_interval: float = 0.1,
        rpc_timeout: float = 5.0,
        register_backoff_max: float = 0.25,
    ) -> None:
        settings.validate()
        self.settings = settings
        self.reconcile_interval = reconcile_interval
        self.reconcile_grace = reconcile_grace
        self.rpc_timeout = rpc_timeout
        self.register_backoff_max = register_backoff_max
        plugins_dir = Path(settings.device_plugins_dir)
        self.socket_path = plugins_dir / socket_name(settings.resource_name)
        self.kubelet_socket = plugins_dir / KUBELET_SOCKET
        self._stats = Stats()
        self._store = CheckpointStore(settings.checkpoint)
        self.allocator = MemifAllocator(settings, self._store)
        self._service = DevicePluginService(self.allocator, self._stats)
        self._endpoint: PluginEndpoint | None = None
        self._watcher = KubeletRestartWatcher(
            self.socket_path, self.kubelet_socket, interval=watch_interval
        )
        self._podresources = PodResourcesClient(settings.pod_resources_socket, timeout=rpc_timeout)
        self._registered = asyncio.Event()
        self._reported_unknown: list[str] = []

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until cancelled. Start-up problems raise ``ConfigError`` (or another
        ``PodwireError``) before anything is registered; a refused registration ends the run."""
        await self._prepare()
        # Settle the grants before kubelet can send new work: stale dirs go, pods are learned.
        await self._reconcile_logged()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._session_loop(), name="deviceplugin-session")
                group.create_task(self._reconcile_loop(), name="deviceplugin-reconcile")
        except BaseExceptionGroup as failed:
            raise _first(failed) from None
        finally:
            self._registered.clear()
            if self._endpoint is not None:
                await self._endpoint.stop(grace=None)

    async def wait_registered(self) -> None:
        await self._registered.wait()

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    async def _prepare(self) -> None:
        self._check_dirs()
        self._endpoint = PluginEndpoint(self.socket_path, self._service)
        self._load_checkpoint()
        try:
            await self._store.save(self.allocator.snapshot())
        except CheckpointWriteError as exc:
            raise ConfigError(f"deviceplugin.checkpoint: {exc}") from exc
        self._check_health()

    def _check_dirs(self) -> None:
        settings = self.settings
        if not os.path.isdir(settings.device_plugins_dir):
            raise ConfigError(
                f"deviceplugin.device_plugins_dir: {settings.device_plugins_dir} does not exist"
                " or is not a directory; is kubelet running on this node with its root dir"
                " at the expected place?"
            )
        if len(str(self.socket_path).encode()) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"deviceplugin.device_plugins_dir: socket path {self.socket_path} is longer than"
                f" {MAX_SOCKET_PATH} bytes"
            )
        try:
            os.makedirs(settings.memif_host_dir, mode=0o755, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"deviceplugin.memif_host_dir: cannot create {settings.memif_host_dir}:"
                f" {exc.strerror or exc}"
            ) from exc

    def _load_checkpoint(self) -> None:
        try:
            data = self._store.load()
        except CheckpointCorrupt as exc:
            self._recover(exc)
            return
        if data is None:
            log.info("deviceplugin.checkpoint.new", path=str(self._store.path))
            return
        try:
            self.allocator.restore(data)
        except CheckpointCorrupt as exc:
            self._recover(exc)
            return
        log.info(
            "deviceplugin.checkpoint.loaded",
            path=str(self._store.path),
            allocations=len(data.allocations),
        )

    def _recover(self, exc: CheckpointCorrupt) -> None:
        """Start with no grants rather than not at all: kubelet still knows every running pod's
        devices, so nothing is handed out twice, and memif dirs we can no longer attribute are
        left alone (their pods may still use them)."""
        moved = self._store.quarantine()
        self._stats.inc("checkpoint_recoveries")
        log.error(
            "deviceplugin.checkpoint.corrupt",
            error=str(exc),
            moved_to=str(moved),
            action="starting with no grants; existing memif dirs are left in place",
        )

    # -- kubelet session -----------------------------------------------------------------

    async def _session_loop(self) -> None:
        assert self._endpoint is not None
        while True:
            await self._register_until_done(self._endpoint)
            self._registered.set()
            self._stats.inc("registrations")
            log.info(
                "deviceplugin.registered",
                resource=self.settings.resource_name,
                endpoint=str(self.socket_path),
                devices=self.allocator.capacity,
            )
            self._watcher.arm()
            reason = await self._watcher.wait()
            self._registered.clear()
            self._stats.inc("kubelet_restarts")
            log.warning("deviceplugin.kubelet_restart", reason=reason)

    async def _register_until_done(self, endpoint: PluginEndpoint) -> None:
        backoff = Backoff(0.01, self.register_backoff_max)
        warned = False
        while True:
            try:
                if not endpoint.alive():
                    await endpoint.start()
                await register(
                    self.kubelet_socket,
                    self.socket_path.name,
                    self.settings.resource_name,
                    rpc_timeout=self.rpc_timeout,
                )
                return
            except RetryableError as exc:
                self._stats.inc("registration_failures")
                if not warned:
                    log.warning("deviceplugin.register.retrying", error=str(exc))
                    warned = True
            except PodwireError:
                self._stats.inc("registration_failures")
                self._stats.inc("errors")
                raise
            await backoff.sleep()

    # -- reconciliation and pod deletion -------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reconcile_interval)
            self._check_health()
            await self._reconcile_logged()

    async def _reconcile_logged(self) -> None:
        try:
            await self.reconcile()
        except RetryableError as exc:
            log.warning("deviceplugin.reconcile.deferred", error=str(exc))
        except PodwireError as exc:
            self._stats.inc("errors")
            log.error("deviceplugin.reconcile.failed", error=str(exc))

    async def reconcile(self) -> ReconcilePlan:
        """Release grants kubelet no longer assigns to a running pod; learn pods of the rest."""
        try:
            assigned = await self._podresources.assignments(
                self.settings.resource_name, holding=len(self.allocator.allocations())
            )
            decided = await self.allocator.reconcile(assigned, self.reconcile_grace)
        except PodwireError:
            self._stats.inc("reconcile_failures")
            raise
        self._stats.inc("reconciles")
        self._stats.inc("releases", len(decided.release))
        if decided.release or decided.bind:
            log.info(
                "deviceplugin.reconciled",
                released=len(decided.release),
                bound=len(decided.bind),
                kept_young=decided.kept_young,
            )
        unknown = self.allocator.unknown_dirs()
        if unknown and unknown != self._reported_unknown:
            log.warning("deviceplugin.unknown_dirs", dirs=unknown, action="left in place")
        self._reported_unknown = unknown
        return decided

    async def release_pod(self, namespace: str, name: str) -> int:
        """Remove the memif dirs and sockets of a deleted pod; idempotent.

        Call on pod deletion only (not on a sandbox re-creation: kubelet reuses a pod's grant
        for its new containers). Returns how many grants were released. When kubelet cannot
        be asked, nothing is released now and reconciliation does it later.
        """
        pod = _pod(namespace, name)
        held = self.allocator.for_pod(pod)
        if not held:
            try:
                devices = await self._podresources.pod_devices(pod, self.settings.resource_name)
            except PodwireError as exc:
                log.warning("deviceplugin.release.deferred", pod=str(pod), error=str(exc))
                return 0
            held = self.allocator.for_devices(devices)
        gone = await self.allocator.release([a.id for a in held], reason=f"pod {pod} deleted")
        self._stats.inc("releases", len(gone))
        return len(gone)

    async def pod_memif(self, namespace: str, name: str) -> list[MemifInfo]:
        """The memif sockets and secrets of a pod, for the agent's CNI ADD."""
        pod = _pod(namespace, name)
        held = self.allocator.for_pod(pod)
        if not held and all(a.pod is not None for a in self.allocator.allocations()):
            return []  # every grant is known to be another pod's: no need to ask kubelet
        if not held:
            devices = await self._podresources.pod_devices(pod, self.settings.resource_name)
            held = self.allocator.for_devices(devices)
            await self.allocator.bind({a.id: pod for a in held})
        return [self.allocator.info(a) for a in held]

    # -- configuration reload and health -------------------------------------------------

    def reload(self, settings: DevicePluginSettings) -> None:
        """Apply a reloaded config: capacity changes go to kubelet through ListAndWatch."""
        settings.validate()
        for field in dataclasses.fields(settings):
            if field.name in RELOADABLE:
                continue
            if getattr(settings, field.name) != getattr(self.settings, field.name):
                raise ConfigError(
                    f"deviceplugin.{field.name}: cannot change while running; restart podwire"
                )
        self.settings = settings
        self.allocator.set_capacity(settings.devices)
        log.info("deviceplugin.reloaded", devices=settings.devices)

    def _check_health(self) -> None:
        directory = self.settings.memif_host_dir
        healthy = os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)
        if healthy != self.allocator.healthy:
            log.warning("deviceplugin.health", healthy=healthy, memif_host_dir=directory)
        self.allocator.set_healthy(healthy)

    def stats(self) -> dict[str, int]:
        counters = self._stats.snapshot()
        counters.update(
            devices=self.allocator.capacity,
            devices_allocated=self.allocator.allocated_devices(),
            grants=len(self.allocator.allocations()),
            registered=int(self.registered),
            healthy=int(self.allocator.healthy),
            checkpoint_writes=self._store.writes,
            superseded=self.allocator.superseded,
        )
        return counters


def _pod(namespace: str, name: str) -> PodName:
    if not (valid_pod_name(namespace) and valid_pod_name(name)):
        raise ValidationError(f"invalid pod reference {namespace!r}/{name!r}")
    return PodName(namespace, name)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """Surface the task's own error, so callers see a ``PodwireError``, not a group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]
