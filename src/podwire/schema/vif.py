"""The VIF API's values: what an agent asks for (``VifRequest``) and what it gets (``Vif``).

They travel as JSON between agent and controller and are recorded in the agent's checkpoint and
the controller's in-use records, so both are parsed strictly here: a malformed VIF must be
rejected before anything is wired with it. docs/vif-api.md describes the endpoints.

- ``POST /v1/nodes/{node}/vifs`` with ``Authorization: Bearer <token of that node>`` and body
  ``VifRequest.to_json()``: ``{"attachment": "<container_id>:<ifname>", "network": "<network id
  or name>", "project_id": "<id or null>", "security_groups": ["<sg id>", ...],
  "pod": {"namespace": "...", "name": "...", "uid": "..."} or null, "replaces": "<port id>"
  (optional)}``
  -> 200 ``{"vif": Vif.to_json()}``; idempotent: the same attachment gets the same VIF again,
  unless ``replaces`` names its port (which vanished before it was wired): then another one.
  -> 503 ``{"error": "...", "retryable": true}`` with ``Retry-After: <s>`` when no port is ready.
  -> 400 malformed body or bad names, 401 missing/unknown token, 403 token of another node,
  404 unknown network/project/SG, 409 node without a live agent: ``{"error": "<message>"}``.
- ``DELETE /v1/nodes/{node}/vifs/{attachment}`` -> 204, idempotent (unknown attachment too).
- ``GET /v1/nodes/{node}/vifs`` -> 200 ``{"attachments": {"<attachment>": Vif.to_json()}}``.
- Ports handed out have device_owner ``compute:podwire`` and are bound to the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from podwire.schema import doc, fields
from podwire.schema.ports import MAX_SECURITY_GROUPS, FixedIp, fixed_ips

DEVICE_OWNER = "compute:podwire"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str = ""

    def to_json(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class VifRequest:
    attachment: str
    network: str
    project_id: str | None
    security_groups: tuple[str, ...]
    pod: PodRef | None = None
    # The port of this attachment's VIF that vanished before its node wired it (its desired
    # key was deleted: Neutron deleted or unbound it): hand out another one instead.
    replaces: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "attachment": self.attachment,
            "network": self.network,
            "project_id": self.project_id,
            "security_groups": list(self.security_groups),
            "pod": None if self.pod is None else self.pod.to_json(),
        }
        if self.replaces is not None:  # only then: controllers before it refuse the field
            body["replaces"] = self.replaces
        return body

    @classmethod
    def from_json(cls, raw: Any, what: str = "body") -> VifRequest:
        obj = doc.Obj(doc.closed_object(raw, what, REQUEST_FIELDS), what)
        return cls(
            attachment=obj.req("attachment", fields.attachment),
            network=obj.req("network", fields.neutron_ref),
            project_id=obj.maybe("project_id", fields.project_id),
            # A set: order and duplicates never matter to Neutron, and the pools group by it.
            security_groups=tuple(sorted(set(_groups(obj)))),
            pod=obj.maybe("pod", pod_ref),
            replaces=obj.maybe("replaces", fields.uuid),
        )


REQUEST_FIELDS = frozenset(
    {"attachment", "network", "project_id", "security_groups", "pod", "replaces"}
)


def _groups(obj: doc.Obj) -> tuple[str, ...]:
    return security_groups(obj.value.get("security_groups"), obj.field("security_groups"))


def security_groups(value: Any, what: str) -> tuple[str, ...]:
    """As many as a port's entry in the mirror may carry, which its agent reads: a pod's
    port carries its CNI config's groups and one per NetworkPolicy selecting it (20 such
    policies were 21 groups, past the 20 this once allowed, so the answer, the in-use record
    and the populate of that set were refused)."""
    if value is None:
        return ()
    return tuple(fields.each(value, what, fields.neutron_id, MAX_SECURITY_GROUPS))


def pod_ref(value: Any, what: str) -> PodRef:
    """A pod as the VIF API names it (and the in-use record keeps it)."""
    obj = doc.Obj(doc.closed_object(value, what, frozenset({"namespace", "name", "uid"})), what)
    return PodRef(
        obj.opt("namespace", _pod_text, ""),
        obj.opt("name", _pod_text, ""),
        obj.opt("uid", _pod_text, ""),
    )


def _pod_text(value: Any, what: str) -> str:
    return fields.text(value, what, 253)


@dataclass(frozen=True)
class Vif:
    port_id: str
    network_id: str
    project_id: str
    mac_address: str
    mtu: int
    fixed_ips: list[FixedIp]
    network_type: str = "vxlan"
    segmentation_id: int | None = None
    vif_type: str = "veth"
    security_groups: list[str] = field(default_factory=list)
    vlan_id: int | None = None  # nested mode: the subport's VLAN on the node's trunk

    def to_json(self) -> dict[str, Any]:
        # Written out: dataclasses.asdict deep-copies, and this runs twice per VIF request
        # (the in-use record and the answer), a tenth of the controller's hot path.
        return {
            "v": doc.SCHEMA_VERSION,
            "port_id": self.port_id,
            "network_id": self.network_id,
            "project_id": self.project_id,
            "mac_address": self.mac_address,
            "mtu": self.mtu,
            "fixed_ips": [ip.to_dict() for ip in self.fixed_ips],
            "network_type": self.network_type,
            "segmentation_id": self.segmentation_id,
            "vif_type": self.vif_type,
            "security_groups": list(self.security_groups),
            "vlan_id": self.vlan_id,
        }

    @classmethod
    def from_json(cls, raw: Any, what: str = "vif") -> Vif:
        """Parse and validate; raises ValidationError naming the bad field."""
        obj = doc.Obj(doc.versioned(raw, what), what)
        return cls(
            port_id=obj.req("port_id", fields.uuid),
            network_id=obj.req("network_id", fields.uuid),
            project_id=obj.req("project_id", fields.project_id),
            mac_address=obj.req("mac_address", fields.mac),
            mtu=obj.req("mtu", fields.mtu),
            fixed_ips=obj.req("fixed_ips", fixed_ips),
            network_type=obj.opt("network_type", fields.network_type, "vxlan"),
            segmentation_id=obj.maybe("segmentation_id", _segmentation_id),
            vif_type=obj.opt("vif_type", lambda v, w: fields.text(v, w, 64, empty=False), "veth"),
            security_groups=list(_groups(obj)),
            vlan_id=obj.maybe("vlan_id", fields.vlan_id),
        )


def _segmentation_id(value: Any, what: str) -> int:
    return fields.integer(value, what, 1, fields.VNI_RANGE[1])
