"""Values the servers (controller, ml2 workers) keep in etcd for each other and for operators.

- ``/podwire/vifs/<node>/<attachment>``: the controller's record that a port is in use;
- ``/podwire/election/<name>``: who leads (the forwarder once wrote its identity as plain
  text; readers accept both forms through the upgrade);
- ``/podwire/status/ml2``: the forwarder's report, which also vouches for the mirror.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from podwire.errors import ValidationError
from podwire.schema import doc, fields
from podwire.schema.vif import PodRef, Vif, pod_ref


@dataclass(frozen=True)
class InUseValue:
    project_id: str
    vif: Vif
    # The pod the port was handed out for, as its VIF request named it; None for a request
    # of no pod, and in records written before the field existed (read alike).
    pod: PodRef | None = None

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "port_id": self.vif.port_id,
            "project_id": self.project_id,
            "network_id": self.vif.network_id,
            "vif": self.vif.to_json(),
        }
        if self.pod is not None:  # only then: a record of no pod stays as it always was
            body["pod"] = self.pod.to_json()
        return doc.encode_versioned(body)


def parse_in_use(raw: bytes, what: str) -> InUseValue:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    vif = obj.req("vif", lambda v, w: Vif.from_json(v, w))
    # The ids are written twice (readable at a glance in etcd): a record whose copies
    # disagree was edited by hand or damaged, and no one can say which port it holds.
    for name in ("port_id", "network_id"):
        if obj.req(name, fields.uuid) != getattr(vif, name):
            raise ValidationError(f"{what}: {name} differs from the VIF's")
    return InUseValue(obj.req("project_id", fields.project_id), vif, obj.maybe("pod", pod_ref))


def leader_value(identity: str, url: str = "") -> bytes:
    """``url``: where the leader serves (standbys name it in their refusals)."""
    value: dict[str, Any] = {"identity": identity, "since": round(time.time(), 3)}
    if url:
        value["url"] = url
    return doc.encode_versioned(value)


@dataclass(frozen=True)
class LeaderRecord:
    identity: str
    url: str = ""  # empty: the leader did not say (an older one, or the ml2 forwarder)


def parse_leader_record(raw: bytes, what: str = "election") -> LeaderRecord:
    """The election key's value, from either form (a bare identity is the older one)."""
    try:
        value = doc.decode(raw, what, 4096)
    except ValidationError:
        value = None
    if isinstance(value, dict):
        obj = doc.Obj(doc.versioned(value, what), what)
        return LeaderRecord(obj.req("identity", _identity), obj.opt("url", fields.http_url, ""))
    return LeaderRecord(_identity(raw.decode(errors="replace"), what))


def parse_leader(raw: bytes, what: str = "election") -> str:
    return parse_leader_record(raw, what).identity


def _identity(value: Any, what: str) -> str:
    return fields.text(value, what, 255, empty=False)


@dataclass(frozen=True)
class Ml2Report:
    forwarder: str
    journal_depth: int
    journal_lag_seconds: float
    sent_rows: int
    feedback_revision: int
    feedback_relists: int
    updated_at: float
    # etcd revision of the forwarder's last write of security-group policy (0: none yet).
    policy_revision: int = 0

    def encode(self) -> bytes:
        return doc.encode_versioned(
            {
                "forwarder": self.forwarder,
                "journal_depth": self.journal_depth,
                "journal_lag_seconds": round(self.journal_lag_seconds, 3),
                "sent_rows": self.sent_rows,
                "feedback_revision": self.feedback_revision,
                "feedback_relists": self.feedback_relists,
                "updated_at": round(self.updated_at, 3),
                "policy_revision": self.policy_revision,
            }
        )


def _count(value: Any, what: str) -> int:
    return fields.integer(value, what, 0, 2**63 - 1)


def parse_ml2_report(raw: bytes, what: str = "ml2 status") -> Ml2Report:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    return Ml2Report(
        forwarder=obj.opt("forwarder", _identity, ""),
        journal_depth=obj.req("journal_depth", _count),
        journal_lag_seconds=obj.opt("journal_lag_seconds", fields.timestamp, 0.0),
        sent_rows=obj.opt("sent_rows", _count, 0),
        feedback_revision=obj.opt("feedback_revision", _count, 0),
        feedback_relists=obj.opt("feedback_relists", _count, 0),
        updated_at=obj.req("updated_at", fields.timestamp),
        policy_revision=obj.opt("policy_revision", _count, 0),
    )
