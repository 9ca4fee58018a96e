"""The namespace's network, as decided from what the API holds and the settings: the reader
keeps the annotation as written (a bad value never makes the namespace unreadable: its labels
still count for policies), the decision refuses it naming namespace and value, and the two
settings ``auto`` needs are checked at start."""

from __future__ import annotations

from typing import Any

import pytest

from podwire.config import KubernetesSettings, build_section
from podwire.errors import ConfigError, ValidationError
from podwire.k8s.ns_network import FINALIZER, Kind, network_choice
from podwire.k8s.objects import read_namespace
from tests.k8s.objects import meta

POOL = "4f1c2c1e-8a0b-4d8e-9a61-0d6c1b7e2f10"
ROUTER = "0b9e2d4c-1f3a-4c5e-8d7f-6a5b4c3d2e1f"
AUTO = KubernetesSettings(kubeconfig="/k", project_id="p", subnet_pool=POOL, cluster_router=ROUTER)
PLAIN = KubernetesSettings(kubeconfig="/k", project_id="p")


def _namespace(network: Any = None, **metadata: Any) -> Any:
    body = meta("team-a", None, {"team": "a"})
    if network is not None:
        body["annotations"] = {"podwire.io/network": network, "other": "x"}
    body.update(metadata)
    return read_namespace({"metadata": body})


def test_the_reader_keeps_the_annotation_the_finalizers_and_the_deletion() -> None:
    plain = _namespace()
    assert (plain.network, plain.deleting, plain.finalizers) == (None, False, ())
    marked = _namespace(
        "auto", finalizers=[FINALIZER, "x.io/y"], deletionTimestamp="2026-01-01T00:00:00Z"
    )
    assert (marked.network, marked.deleting) == ("auto", True)
    assert marked.finalizers == (FINALIZER, "x.io/y")
    # Malformed values are still read, with the namespace's labels: the decision refuses.
    assert _namespace("Not A Network").meta.labels == {"team": "a"}
    assert _namespace(7).network is None  # not a string: as if absent


def test_the_choice() -> None:
    assert network_choice(_namespace(), AUTO).kind is Kind.DEFAULT
    assert network_choice(_namespace("auto"), AUTO).kind is Kind.AUTO
    named = network_choice(_namespace(POOL), PLAIN)
    assert (named.kind, named.network_id) == (Kind.NAMED, POOL)


@pytest.mark.parametrize(
    ("value", "settings", "says"),
    [
        ("my-net", AUTO, "'my-net' is neither 'auto' nor a Neutron network id"),
        (POOL.upper(), AUTO, "is neither 'auto' nor"),
        ("Auto", AUTO, "'Auto' is neither"),
        ("", AUTO, "'' is neither"),
        ("auto", PLAIN, "kubernetes.subnet_pool and kubernetes.cluster_router are not set"),
    ],
)
def test_refusals_name_the_namespace_and_the_value(
    value: str, settings: KubernetesSettings, says: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        network_choice(_namespace(value), settings)
    assert "namespace team-a: annotation podwire.io/network" in str(refused.value)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"subnet_pool": POOL}, "set both or neither"),
        ({"cluster_router": ROUTER}, "set both or neither"),
        ({"subnet_pool": "pool", "cluster_router": ROUTER}, "kubernetes.subnet_pool"),
        ({"subnet_pool": POOL, "cluster_router": "r"}, "kubernetes.cluster_router"),
    ],
)
def test_the_auto_settings_are_checked_at_start(values: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_section(
            KubernetesSettings, {"kubeconfig": "/k", "project_id": "p", **values}, "kubernetes"
        )
    assert build_section(
        KubernetesSettings,
        {"kubeconfig": "/k", "project_id": "p", "subnet_pool": POOL, "cluster_router": ROUTER},
        "kubernetes",
    ).auto_networks
