"""The in-use attachments of one leader term: which attachment holds which port.

This is the "no port handed out twice" record, so it has one owner and every change goes
through a method here: a record held, replaced or dropped, a term's records loaded from etcd
or forgotten. Each change tells ``on_change`` (the in-use gauge, the pod annotations' wake-up).

A port several records hold (a restored or hand-edited etcd) is *disputed*: all its records
are kept, and dropping one of them gives the port back to no pool while another still holds
it; the node's agent settles it (``GET .../vifs`` lists the disputes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from podwire.log import get_logger
from podwire.schema.inuse import InUse
from podwire.schema.vif import Vif

log = get_logger(__name__)

Ident = tuple[str, str]  # (node, attachment)


class Attachments:
    def __init__(self, on_change: Callable[[int], None]) -> None:
        """``on_change``: called with the number of records after every change."""
        self._records: dict[Ident, InUse] = {}
        self._disputed: dict[str, set[Ident]] = {}  # port -> the records holding it
        self._on_change = on_change
        self.view: Mapping[Ident, InUse] = MappingProxyType(self._records)

    def get(self, ident: Ident) -> InUse | None:
        return self._records.get(ident)

    def hold(self, record: InUse) -> InUse | None:
        """Record (or replace) an attachment's port; returns the record it replaced."""
        ident = (record.node, record.attachment)
        replaced = self._records.get(ident)
        self._records[ident] = record
        self._changed()
        return replaced

    def drop(self, ident: Ident) -> InUse | None:
        """Forget an attachment's record; returns it, unless there was none or another
        record still holds its port (a dispute: the port stays with that one)."""
        record = self._records.pop(ident, None)
        if record is None:
            return None
        self._changed()
        return None if self._still_held(ident, record) else record

    def load(self, records: Iterable[InUse]) -> None:
        """A new term's records, as etcd has them; disputes are found and logged."""
        holders: dict[str, set[Ident]] = {}
        for record in records:
            ident = (record.node, record.attachment)
            self._records[ident] = record
            holders.setdefault(record.vif.port_id, set()).add(ident)
        self._disputed = {port: held for port, held in holders.items() if len(held) > 1}
        for port_id, held in sorted(self._disputed.items()):
            log.warning(
                "controller.inuse.duplicate",
                port=port_id,
                records=sorted("/".join(h) for h in held),
            )
        self._changed()

    def clear(self) -> None:
        self._records.clear()
        self._disputed.clear()
        self._changed()

    def of_node(self, node: str) -> dict[Ident, InUse]:
        return {ident: r for ident, r in self._records.items() if ident[0] == node}

    def vifs_of_node(self, node: str) -> dict[str, Vif]:
        return {ident[1]: r.vif for ident, r in self.of_node(node).items()}

    def disputed_on(self, node: str) -> dict[str, list[str]]:
        """This node's ports held by several attachments: port -> attachments."""
        return {
            port_id: sorted(att for n, att in holders if n == node)
            for port_id, holders in self._disputed.items()
            if any(n == node for n, _ in holders)
        }

    def held_elsewhere(self, ident: Ident, record: InUse) -> bool:
        """Whether another node's record holds this port too (a dispute)."""
        holders = self._disputed.get(record.vif.port_id, set())
        return any(other[0] != ident[0] for other in holders)

    def _still_held(self, ident: Ident, record: InUse) -> bool:
        holders = self._disputed.get(record.vif.port_id)
        if holders is None:
            return False
        holders.discard(ident)
        log.warning(
            "controller.inuse.duplicate_dropped",
            port=record.vif.port_id,
            dropped=f"{ident[0]}/{ident[1]}",
            kept=sorted(f"{n}/{a}" for n, a in holders),
        )
        if len(holders) <= 1:
            del self._disputed[record.vif.port_id]
        return bool(holders)

    def _changed(self) -> None:
        self._on_change(len(self._records))
