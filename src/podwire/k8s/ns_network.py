"""Which Neutron network a namespace's pods use: the one decision, from the namespace's
``podwire.io/network`` annotation and the settings, with no call to anyone.

The annotation holds a network's id, not its name: Neutron names are neither unique nor
stable, and a namespace that silently moved to another network of the same name would be
worse than one refused. ``auto`` asks for a network of the namespace's own."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from podwire.config import KubernetesSettings
from podwire.errors import ValidationError
from podwire.k8s.objects import NETWORK_ANNOTATION, K8sNamespace
from podwire.schema import fields

AUTO = "auto"
# On a namespace whose network podwire made: the namespace stays until the network is gone.
FINALIZER = "podwire.io/network"


class Kind(enum.Enum):
    DEFAULT = "default"  # the node's network, from its CNI config
    AUTO = "auto"  # the namespace's own, made by podwire
    NAMED = "named"  # a network the operator made, by id


@dataclass(frozen=True)
class NetworkChoice:
    kind: Kind
    network_id: str = ""  # NAMED only


DEFAULT_CHOICE = NetworkChoice(Kind.DEFAULT)


def network_choice(namespace: K8sNamespace, settings: KubernetesSettings) -> NetworkChoice:
    """Raises ValidationError naming the namespace and the value when the annotation is
    neither ``auto`` nor a network id, or asks for ``auto`` that the settings do not allow."""
    value = namespace.network
    if value is None:
        return DEFAULT_CHOICE
    what = f"namespace {namespace.meta.key}: annotation {NETWORK_ANNOTATION}"
    if value == AUTO:
        if not settings.auto_networks:
            raise ValidationError(
                f"{what} is 'auto', but kubernetes.subnet_pool and kubernetes.cluster_router"
                " are not set: podwire makes no namespace networks"
            )
        return NetworkChoice(Kind.AUTO)
    try:
        network_id = fields.uuid(value, what)
    except ValidationError as exc:
        raise ValidationError(
            f"{what}: {value[:80]!r} is neither 'auto' nor a Neutron network id"
        ) from exc
    return NetworkChoice(Kind.NAMED, network_id)
