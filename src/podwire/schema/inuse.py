"""A port in use as the controller holds it, and the keys its pools go by.

``InUse`` is the record ``/podwire/vifs/<node>/<attachment>`` keeps (its value is
``records.InUseValue``; the controller's ``inuse`` module reads and writes it in etcd).
``PoolKey`` is the pool a port belongs to, ``sg_key`` the group of its security groups. The
controller's pools and its Kubernetes side (``podwire.kubeside``) both hold these values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from podwire.schema.records import InUseValue
from podwire.schema.vif import PodRef, Vif

SgKey = tuple[str, ...]


class PoolKey(NamedTuple):
    node: str
    project_id: str
    network_id: str

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "project_id": self.project_id, "network_id": self.network_id}


def sg_key(security_groups: Iterable[str]) -> SgKey:
    """The group a port belongs to: order and duplicates of SG ids must not matter."""
    return tuple(sorted(set(security_groups)))


@dataclass(frozen=True)
class InUse:
    node: str
    attachment: str
    key: PoolKey
    vif: Vif
    # The etcd key the record was read from, when it is not the canonical one (a record from
    # before attachment ids were ``<container>:<ifname>``); ``load`` moves it.
    legacy_key: str | None = None
    # The pod its VIF request named (None: no pod, or a record written before pods were
    # kept): what moves the port to its pod's NetworkPolicy groups and releases it once the
    # Kubernetes API no longer has the pod.
    pod: PodRef | None = None

    def encode(self) -> bytes:
        return InUseValue(self.key.project_id, self.vif, self.pod).encode()
