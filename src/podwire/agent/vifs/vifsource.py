"""Where the agent gets a pod's VIF: one narrow seam, two implementations.

``ControllerVifSource`` calls the controller's VIF API (pools, the normal path);
``NeutronVifSource`` creates and deletes a Neutron port itself (``vif_source = "neutron"``:
the way to run without a controller). The CNI handler only sees this Protocol.
"""

from __future__ import annotations

from typing import Protocol

from podwire.agent.cni.request import CniRequest
from podwire.schema.vif import Vif, VifRequest


def vif_request(req: CniRequest, attachment: str, replaces: str | None = None) -> VifRequest:
    """What a CNI ADD asks the source for, for one of its ports (the pod's, its memif's);
    ``replaces``: the port it got before, which vanished before it was wired."""
    conf = req.conf
    return VifRequest(
        attachment, conf.network, conf.project, conf.security_groups, req.pod, replaces
    )


class VifSource(Protocol):
    async def request(self, req: VifRequest, deadline: float) -> Vif:
        """A VIF bound to this node; idempotent per attachment. Raises RetryableError while
        none is ready by ``deadline`` (loop time) and PermanentError for a bad request."""

    async def release(self, attachment: str, vif: Vif | None) -> None:
        """Give the attachment's port back; succeeds when it is already gone."""

    async def held(self) -> set[str]:
        """The attachments this node holds a port for at the source (GC compares them with
        the checkpoint: an agent crash between the answer and the checkpoint leaves some)."""

    async def healthy(self) -> tuple[bool, str]:
        """Whether requests can be served now (for CNI STATUS and /readyz)."""
