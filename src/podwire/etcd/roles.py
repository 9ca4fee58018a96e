"""The etcd roles podwire's components need, derived from the key layout in ``keys``.

Each role lists exactly the ranges its component reads or writes, so a node's credentials
cannot touch another node's keys: an agent writes only under its own state prefix. It reads
every node's desired ports (what Neutron bound where, written by the ml2 forwarder alone): a
peer's claim of a port counts only when Neutron bound that port to that peer. Grants name
keys as etcd stores them: a deployment's namespace in front, so a node of one deployment
cannot read another's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from podwire import keys
from podwire.schema.deployment import DEFAULT, Deployment

Access = Literal["read", "readwrite"]
COMPONENTS = ("ml2", "controller")


@dataclass(frozen=True)
class Grant:
    """Access to one key, or to every key under it when ``prefix``."""

    access: Access
    key: str
    prefix: bool = True


@dataclass(frozen=True)
class RoleSpec:
    name: str
    grants: tuple[Grant, ...]


def node_role(host: str, deployment: Deployment = DEFAULT) -> RoleSpec:
    """What ``podwire agent`` on ``host`` touches."""
    grants = (
        Grant("read", keys.nodes_prefix()),  # its own ports, and what backs peers' claims
        Grant("read", keys.state_prefix() + "nodes/"),  # peers: VTEPs, alive
        Grant("readwrite", keys.state_node_prefix(host)),
        Grant("read", keys.global_prefix()),
        Grant("read", keys.services_prefix()),  # Services, translated in its pods
    )
    name = deployment.role_name(f"podwire-node-{keys.check_segment(host, 'node')}")
    return RoleSpec(name, _within(deployment, grants))


def server_role(component: str, deployments: Sequence[Deployment] = (DEFAULT,)) -> RoleSpec:
    """What the ml2 driver (inside neutron-server, serving every deployment it lists) or a
    deployment's controller touches."""
    if component == "controller" and len(deployments) != 1:
        raise ValueError("a controller belongs to exactly one deployment")
    grants = tuple(g for d in deployments for g in _within(d, _server_grants(component)))
    name = f"podwire-{component}"
    return RoleSpec(deployments[0].role_name(name) if component == "controller" else name, grants)


def _within(deployment: Deployment, grants: tuple[Grant, ...]) -> tuple[Grant, ...]:
    namespace = deployment.etcd_namespace
    return tuple(Grant(g.access, namespace + g.key, g.prefix) for g in grants)


def _server_grants(component: str) -> tuple[Grant, ...]:
    if component == "ml2":
        grants: tuple[Grant, ...] = (
            Grant("readwrite", keys.nodes_prefix()),  # desired ports, written by the forwarder
            Grant("read", keys.state_prefix()),  # feedback and the host cache
            # Watched keys are ranges: a PrefixWatcher lists and watches "key*".
            Grant("readwrite", keys.election("forwarder")),
            Grant("readwrite", keys.KICK),
            Grant("readwrite", keys.status("ml2"), prefix=False),
            Grant("readwrite", keys.global_prefix()),  # security groups
        )
    elif component == "controller":
        grants = (
            Grant("read", keys.nodes_prefix()),  # the forwarder's mirror of bound ports
            Grant("read", keys.state_prefix()),  # alive nodes, capabilities
            Grant("readwrite", keys.vifs_prefix()),
            Grant("readwrite", keys.services_prefix()),  # Kubernetes Services, for agents
            Grant("readwrite", keys.election("controller")),  # watched: a range
            Grant("read", f"{keys.ROOT}/election/"),  # podwire status: every leader
            Grant("read", f"{keys.ROOT}/status/"),  # ml2's report; podwire status
        )
    else:
        raise ValueError(f"component {component!r}: expected one of {', '.join(COMPONENTS)}")
    return grants
