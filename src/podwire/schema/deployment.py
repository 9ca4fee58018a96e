"""A deployment: one podwire installation (one Kubernetes cluster's controller and agents).

Several deployments may share one Neutron and one etcd (the usual case: several clusters in
one OpenStack). What keeps them apart is decided here, once: the Neutron tag every port a
deployment creates carries, and the etcd namespace all its keys live under. The default
deployment keeps the layout podwire had before deployments existed (no namespace), so an
existing installation upgrades without moving a key; it also adopts the untagged ports such
an installation created.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from podwire.errors import ValidationError

DEFAULT_NAME = "podwire"
TAG_PREFIX = "podwire-deployment="
# Letters, digits and '-': safe in an etcd key, a Neutron tag (at most 60 characters with the
# prefix) and an etcd role name.
NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
NAMESPACES = "/podwire-deployments/"


@dataclass(frozen=True)
class Deployment:
    name: str = DEFAULT_NAME

    @classmethod
    def named(cls, value: object, what: str = "deployment") -> Deployment:
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise ValidationError(
                f"{what}: {value!r} is not a deployment name: lower-case letters, digits and"
                " '-', starting and ending with a letter or digit, at most 40 characters"
            )
        return cls(value)

    @property
    def tag(self) -> str:
        """The Neutron tag on every port this deployment creates."""
        return TAG_PREFIX + self.name

    @property
    def etcd_namespace(self) -> str:
        """Prepended to every etcd key by the client; empty for the default deployment."""
        return "" if self.name == DEFAULT_NAME else f"{NAMESPACES}{self.name}"

    @property
    def adopts_untagged(self) -> bool:
        """Ports from before deployments existed belong to the default deployment."""
        return self.name == DEFAULT_NAME

    def role_name(self, role: str) -> str:
        """An etcd role or user name of this deployment (unchanged for the default one)."""
        return role if self.name == DEFAULT_NAME else f"{role}@{self.name}"


DEFAULT = Deployment()


def deployments(names: Iterable[str], what: str) -> list[Deployment]:
    """A list of deployments (the ml2 driver's, the stack's, an etcd user's): each a valid
    name, none twice, at least one."""
    chosen = [Deployment.named(name.strip(), what) for name in names]
    if not chosen:
        raise ValidationError(f"{what}: name at least one deployment")
    if len({d.name for d in chosen}) != len(chosen):
        raise ValidationError(f"{what}: {[d.name for d in chosen]!r} names a deployment twice")
    return chosen
