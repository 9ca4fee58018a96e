"""Controller errors; the API maps each to one HTTP status and names its ``cause``.

Every answer the VIF API gives on failure is ``{"error": <message>, "retryable": <bool>,
"cause": <one of the names below>}`` (docs/vif-api.md has the table): the message says what is
wrong in words an operator can act on, ``retryable`` whether the same request may succeed
later, ``cause`` what kind of failure it is, for programs (the agent maps it to a CNI code).
``podwire.errors`` holds the few the Kubernetes side (``podwire.kubeside``) tells apart too
(``UnknownResource``, ``UnknownNetwork``), ``kubeside.errors`` the refusals it gives a pod's
request (``policy_not_ready``, ``namespace_network``).
"""

from __future__ import annotations

from podwire.errors import PermanentError, RetryableError, UnknownResource


class PoolNotReady(RetryableError):
    """No port could be handed out now (pool empty, refill failed or still running)."""

    cause = "pool_empty"


class NotServing(RetryableError):
    """This controller is not the leader or has not finished recovery."""

    cause = "not_serving"

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader  # where the leader serves, when known


class UnknownSecurityGroup(UnknownResource):
    cause = "unknown_security_group"


class UnknownTrunk(UnknownResource):
    """A nested node has no trunk podwire may use: none of its name in the pool's project, or
    the id ``pool.nested_trunks`` gives is not Neutron's."""

    cause = "unknown_trunk"


class Forbidden(PermanentError):
    """The caller's token does not allow this (HTTP 403)."""

    cause = "wrong_node"


class NetworkNotAllowed(Forbidden):
    """The request's project may not use the network: another project's, not shared."""

    cause = "network_not_allowed"


class SecurityGroupNotAllowed(Forbidden):
    """A security group of the request is not its project's."""

    cause = "security_group_not_allowed"


class TrunkNotAllowed(Forbidden):
    """The node's trunk is another project's: its VM would receive the pool project's
    traffic, so no subport is ever added to it."""

    cause = "trunk_not_allowed"


class Unauthorized(PermanentError):
    """No token or an unknown token (HTTP 401)."""

    cause = "unauthorized"


class Unusable(PermanentError):
    """What the request names exists but no port can be made from it (HTTP 409)."""

    cause = "unusable"


class NodeNotAlive(Unusable):
    """The node has no live agent, so ports for it could not bind."""

    cause = "node_not_alive"


class NetworkAmbiguous(Unusable):
    """Several networks the project may use carry the name the request gives."""

    cause = "network_ambiguous"


class NetworkDown(Unusable):
    """The network is administratively down (``admin_state_up`` false)."""

    cause = "network_down"


class NetworkWithoutSubnet(Unusable):
    """The network has no subnet: a pod would get a port without any address."""

    cause = "network_without_subnet"


class SubnetFull(Unusable):
    """Neutron has no free address left in the network's subnets."""

    cause = "subnet_full"


class TrunkAmbiguous(Unusable):
    """Several trunks of the pool's project carry the nested node's name."""

    cause = "trunk_ambiguous"


class BindingFailed(Unusable):
    """Neutron made the ports, but podwire's ml2 driver bound none of them to the node (they
    were rebound, then deleted); a populate says so instead of answering that it made 0."""

    cause = "binding_failed"


class NodeNotPooled(Unusable):
    """The node's driver keeps no pool (``unpooled``): there is nothing to populate."""

    cause = "not_pooled"


class PhysnetNotServed(Unusable):
    """The network's physical network is not mapped by the node's agent."""

    cause = "physnet_not_served"
