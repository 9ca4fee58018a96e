"""Memif grants: device bookkeeping, host dirs and secrets, made durable before they are used.

Ordering rules that keep the disk consistent across crashes: a grant is checkpointed before
its host dir is created, and its host dir is removed before the grant is dropped from the
checkpoint. So every dir podwire made is always covered by the checkpoint, and a crash leaves
at worst a checkpointed grant without a dir, which reconciliation releases harmlessly.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from podwire.config import DevicePluginSettings
from podwire.deviceplugin import reconcile
from podwire.deviceplugin.api import HEALTHY, UNHEALTHY
from podwire.deviceplugin.checkpoint import (
    CheckpointCorrupt,
    CheckpointData,
    CheckpointIncompatible,
    CheckpointStore,
    CheckpointWriteError,
)
from podwire.deviceplugin.model import (
    SECRET_LEN,
    SOCKET_FILE,
    Allocation,
    DeviceNames,
    MemifInfo,
    PodName,
    host_dir,
)
from podwire.errors import RetryableError, ValidationError
from podwire.log import get_logger

log = get_logger(__name__)


class AllocateRejected(ValidationError):
    """The request itself is wrong; kubelet must not retry it unchanged."""


class AllocateConflict(RetryableError):
    """Another in-flight request holds one of the devices."""


class DevicesUnavailable(RetryableError):
    """The memif host dir cannot be used right now."""


@dataclass(frozen=True)
class MemifGrant:
    allocation: Allocation
    info: MemifInfo


class MemifAllocator:
    def __init__(
        self,
        settings: DevicePluginSettings,
        store: CheckpointStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.names = DeviceNames(settings.resource_name)
        self._capacity = settings.devices
        self._store = store
        self._clock = clock
        self._allocations: dict[str, Allocation] = {}
        self._owner: dict[str, str] = {}
        self._inflight: set[str] = set()
        self._lock = asyncio.Lock()
        self._healthy = True
        self._version = 0
        self._changed = asyncio.Event()
        self.superseded = 0

    # -- state at start ------------------------------------------------------------------

    def restore(self, data: CheckpointData) -> None:
        if data.resource_name != self.settings.resource_name:
            raise CheckpointIncompatible(
                f"checkpoint {self._store.path}: written for resource {data.resource_name!r},"
                f" configured resource is {self.settings.resource_name!r}; restore the setting"
                " or drain the node and remove the checkpoint"
            )
        if data.memif_host_dir != self.settings.memif_host_dir:
            raise CheckpointIncompatible(
                f"checkpoint {self._store.path}: its grants live under {data.memif_host_dir},"
                f" configured memif_host_dir is {self.settings.memif_host_dir}; restore the"
                " setting or drain the node and remove the checkpoint"
            )
        for allocation in data.allocations:
            for device in allocation.devices:
                if self.names.index(device) is None:
                    raise CheckpointCorrupt(
                        f"checkpoint {self._store.path}: device id {device!r} is not one of"
                        f" {self.settings.resource_name}'s ids ({self.names.prefix}N)"
                    )
            self._add(allocation)
        self._bump()

    # -- device list (ListAndWatch) ------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def version(self) -> int:
        return self._version

    def devices(self) -> list[tuple[str, str]]:
        """All device ids with health; granted ids above a reduced capacity stay, unhealthy,
        until released, so kubelet does not think a pod lost its device."""
        health = HEALTHY if self._healthy else UNHEALTHY
        listed = [(self.names.device_id(i), health) for i in range(self._capacity)]
        extra = sorted(
            (index, device)
            for device in self._owner
            if (index := self.names.index(device)) is not None and index >= self._capacity
        )
        listed.extend((device, UNHEALTHY) for _, device in extra)
        return listed

    async def wait_changed(self, seen: int) -> None:
        while self._version == seen:
            await self._changed.wait()

    def set_capacity(self, devices: int) -> None:
        if devices != self._capacity:
            self._capacity = devices
            self._bump()

    def set_healthy(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            self._bump()

    @property
    def healthy(self) -> bool:
        return self._healthy

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    # -- queries -------------------------------------------------------------------------

    def allocations(self) -> list[Allocation]:
        return list(self._allocations.values())

    def allocated_devices(self) -> int:
        return len(self._owner)

    def info(self, allocation: Allocation) -> MemifInfo:
        directory = host_dir(self.settings.memif_host_dir, allocation.id)
        return MemifInfo(
            devices=allocation.devices,
            host_dir=str(directory),
            host_socket=str(directory / SOCKET_FILE),
            container_socket=os.path.join(self.settings.memif_container_dir, SOCKET_FILE),
            secret=allocation.secret,
        )

    def for_devices(self, devices: Sequence[str]) -> list[Allocation]:
        ids = {self._owner[d] for d in devices if d in self._owner}
        return [self._allocations[i] for i in sorted(ids)]

    def for_pod(self, pod: PodName) -> list[Allocation]:
        return [a for a in self._allocations.values() if a.pod == pod]

    # -- validation ----------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[str], what: str) -> list[int]:
        indexes: list[int] = []
        seen: set[str] = set()
        for device in ids:
            index = self.names.index(device)
            if index is None or index >= self._capacity:
                raise AllocateRejected(
                    f"{what}: unknown device id {device!r} for {self.settings.resource_name}"
                    f" (valid ids are {self.names.prefix}0 .. {self.names.prefix}"
                    f"{self._capacity - 1})"
                )
            if device in seen:
                raise AllocateRejected(f"{what}: device id {device!r} is listed more than once")
            seen.add(device)
            indexes.append(index)
        return indexes

    def _check_allocate(self, requests: Sequence[Sequence[str]]) -> None:
        if not requests:
            raise AllocateRejected("empty request: no container_requests")
        for position, ids in enumerate(requests):
            if not ids:
                raise AllocateRejected(f"container_requests[{position}] has no devices_ids")
        total = sum(len(ids) for ids in requests)
        if total > self._capacity:
            raise AllocateRejected(
                f"request asks for {total} devices but {self.settings.resource_name} has only"
                f" {self._capacity}"
            )
        self._check_ids([d for ids in requests for d in ids], "allocate")

    # -- allocate ------------------------------------------------------------------------

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[MemifGrant]:
        """Grant every container request or none: any failure undoes the whole call."""
        self._check_allocate(requests)
        async with self._lock:
            if not self._healthy:
                raise DevicesUnavailable(
                    f"memif host dir {self.settings.memif_host_dir} is not usable;"
                    " devices are unhealthy"
                )
            superseded: set[str] = set()
            for ids in requests:
                for device in ids:
                    owner = self._owner.get(device)
                    if owner is None:
                        continue
                    if owner in self._inflight:
                        raise AllocateConflict(
                            f"device {device} is being allocated by a concurrent request"
                        )
                    superseded.add(owner)
            now = self._clock()
            fresh = [Allocation(self._new_id(), tuple(ids), _new_secret(), now) for ids in requests]
            dropped = [self._remove(i) for i in sorted(superseded)]
            for allocation in fresh:
                self._add(allocation)
                self._inflight.add(allocation.id)
            gen = self._store.stage(self.snapshot())
        for old in dropped:
            # Kubelet hands out only devices it considers free, so their previous holder is
            # gone; its grant is stale (a missed pod deletion) and is replaced.
            self.superseded += 1
            log.warning(
                "deviceplugin.allocation.superseded", allocation=old.id, devices=list(old.devices)
            )
        created: list[str] = []
        try:
            await self._store.flush(gen)
            for allocation in fresh:
                directory = host_dir(self.settings.memif_host_dir, allocation.id)
                try:
                    os.mkdir(directory, 0o755)
                except OSError as exc:
                    raise DevicesUnavailable(
                        f"cannot create memif dir {directory}: {exc.strerror or exc}"
                    ) from exc
                created.append(allocation.id)
        except BaseException:
            await self._rollback(fresh, created)
            raise
        finally:
            self._inflight.difference_update(a.id for a in fresh)
        for old in dropped:
            _remove_dir(self.settings.memif_host_dir, old.id)
        return [MemifGrant(a, self.info(a)) for a in fresh]

    async def _rollback(self, fresh: Sequence[Allocation], created: Sequence[str]) -> None:
        for allocation_id in created:
            _remove_dir(self.settings.memif_host_dir, allocation_id)
        async with self._lock:
            for allocation in fresh:
                if allocation.id in self._allocations:
                    self._remove(allocation.id)
            gen = self._store.stage(self.snapshot())
        try:
            await self._store.flush(gen)
        except CheckpointWriteError as exc:
            # The checkpoint may still list the failed grants, with no dir: reconciliation
            # releases them once they are older than the grace period.
            log.error("deviceplugin.rollback.checkpoint_failed", error=str(exc))

    # -- release and reconcile -----------------------------------------------------------

    async def release(self, allocation_ids: Sequence[str], reason: str) -> list[Allocation]:
        async with self._lock:
            gone = [
                self._allocations[i]
                for i in allocation_ids
                if i in self._allocations and i not in self._inflight
            ]
            for allocation in gone:
                _remove_dir(self.settings.memif_host_dir, allocation.id)
                self._remove(allocation.id)
                log.info(
                    "deviceplugin.allocation.released",
                    allocation=allocation.id,
                    devices=list(allocation.devices),
                    pod=str(allocation.pod) if allocation.pod else "",
                    reason=reason,
                )
            if not gone:
                return []
            if any(self._above_capacity(a.devices) for a in gone):
                self._bump()
            gen = self._store.stage(self.snapshot())
        await self._store.flush(gen)
        return gone

    async def bind(self, binding: Mapping[str, PodName]) -> None:
        """Remember which pod holds a grant, so a pod deletion finds it without kubelet."""
        async with self._lock:
            changed = False
            for allocation_id, pod in binding.items():
                current = self._allocations.get(allocation_id)
                if current is not None and current.pod != pod:
                    self._allocations[allocation_id] = replace(current, pod=pod)
                    changed = True
            if not changed:
                return
            gen = self._store.stage(self.snapshot())
        await self._store.flush(gen)

    async def reconcile(
        self, assigned: Mapping[str, PodName], grace: float
    ) -> reconcile.ReconcilePlan:
        decided = reconcile.plan(
            self._allocations.values(),
            assigned,
            now=self._clock(),
            grace=grace,
            busy=self._inflight,
        )
        await self.bind(decided.bind)
        await self.release(decided.release, reason="not assigned to a running pod")
        return decided

    # -- preferred allocation ------------------------------------------------------------

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """Must-include first, then free devices, then stale-held ones; lowest index first."""
        what = "preferred allocation"
        available_idx = dict(zip(available, self._check_ids(available, what), strict=True))
        self._check_ids(must_include, what)
        missing = [d for d in must_include if d not in available_idx]
        if missing:
            raise AllocateRejected(f"{what}: must-include device {missing[0]!r} is not available")
        if not 1 <= size <= len(available):
            raise AllocateRejected(
                f"{what}: allocation_size {size} must be between 1 and the {len(available)}"
                " available devices"
            )
        if len(must_include) > size:
            raise AllocateRejected(
                f"{what}: {len(must_include)} must-include devices exceed allocation_size {size}"
            )
        chosen = sorted(must_include, key=available_idx.__getitem__)
        rest = sorted(
            (d for d in available if d not in set(must_include)),
            key=lambda d: (d in self._owner, available_idx[d]),
        )
        return chosen + rest[: size - len(chosen)]

    # -- internals -----------------------------------------------------------------------

    def _add(self, allocation: Allocation) -> None:
        self._allocations[allocation.id] = allocation
        for device in allocation.devices:
            self._owner[device] = allocation.id

    def _remove(self, allocation_id: str) -> Allocation:
        allocation = self._allocations.pop(allocation_id)
        for device in allocation.devices:
            if self._owner.get(device) == allocation_id:
                del self._owner[device]
        return allocation

    def _above_capacity(self, devices: Sequence[str]) -> bool:
        return any((self.names.index(d) or 0) >= self._capacity for d in devices)

    def _new_id(self) -> str:
        while True:
            candidate = secrets.token_hex(10)
            if candidate not in self._allocations:
                return candidate

    def snapshot(self) -> CheckpointData:
        return CheckpointData(
            self.settings.resource_name,
            self.settings.memif_host_dir,
            tuple(self._allocations.values()),
        )

    def unknown_dirs(self) -> list[str]:
        return [
            str(p) for p in reconcile.unknown_dirs(self.settings.memif_host_dir, self._allocations)
        ]


def _new_secret() -> str:
    # token_urlsafe(18) is exactly 24 characters: the size of memif's secret field.
    secret = secrets.token_urlsafe(18)
    assert len(secret) == SECRET_LEN
    return secret


def _remove_dir(base: str, allocation_id: str) -> None:
    """Remove a grant's dir (and the memif socket VPP created in it); a missing dir is fine."""
    directory = host_dir(base, allocation_id)
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("deviceplugin.dir.remove_failed", dir=str(directory), error=str(exc))
