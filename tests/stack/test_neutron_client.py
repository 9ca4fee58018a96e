"""podwire's Neutron front against the real Neutron: results and translated errors."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from podwire.config import NeutronSettings
from podwire.neutron.client import (
    NeutronNotFound,
    NeutronRequestError,
    NeutronUnavailable,
    connect,
)
from podwire.stack.netutil import free_port


def test_bulk_create_list_and_errors(neutron_endpoint: str, neutron: Any, project_id: str) -> None:
    client = connect(NeutronSettings(endpoint=neutron_endpoint))
    network = neutron.network.create_network(name="client", project_id=project_id)
    neutron.network.create_subnet(
        network_id=network.id, cidr="10.30.0.0/24", ip_version=4, project_id=project_id
    )
    body = {"network_id": network.id, "project_id": project_id}
    created = client.create_ports([body, body, body], "podwire-deployment=client")
    assert [port.tags for port in created] == [["podwire-deployment=client"]] * 3
    assert len({port.id for port in created}) == 3
    assert {p.id for p in client.list_ports(project_id=project_id)} == {p.id for p in created}
    assert client.find_network(network.id).id == network.id
    with pytest.raises(NeutronNotFound, match="HTTP 404"):
        client.get_port(str(uuid.uuid4()))
    with pytest.raises(NeutronRequestError, match="HTTP 400"):
        client.create_ports([{"network_id": "not-a-network", "project_id": project_id}], "t")
    summaries = {p.id: p for p in client.list_port_summaries(project_id=project_id)}
    for port in created:
        summary = summaries[port.id]
        assert (summary.mac_address, summary.network_id) == (port.mac_address, network.id)
        assert summary.fixed_ips == port.fixed_ips
        assert summary.security_group_ids == port.security_group_ids
        assert (summary.binding_host_id, summary.project_id) == ("", project_id)
        assert summary.tags == ("podwire-deployment=client",)
    client.tag_port(created[1].id, "extra")
    client.tag_port(created[1].id, "extra")  # idempotent
    tagged = client.list_port_summaries(project_id=project_id, tags="extra")
    assert [p.id for p in tagged] == [created[1].id]
    client.delete_port(created[0].id)
    client.delete_port(created[0].id)  # idempotent


def test_unreachable_neutron_is_retryable() -> None:
    client = connect(NeutronSettings(endpoint=f"http://127.0.0.1:{free_port()}/"))
    with pytest.raises(NeutronUnavailable, match="neutron list ports"):
        client.list_ports()


def test_ignored_tags_refuse_and_leave_no_port(
    neutron_endpoint: str, neutron: Any, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Neutron without the tagging extension driver: the ports it made are deleted again."""
    client = connect(NeutronSettings(endpoint=neutron_endpoint))
    network = neutron.network.create_network(name="untagged", project_id=project_id)
    made: list[Any] = []
    create = client._create_ports

    def dropping_tags(bodies: list[dict[str, Any]]) -> list[Any]:
        made.extend(create([{k: v for k, v in b.items() if k != "tags"} for b in bodies]))
        return made

    monkeypatch.setattr(client, "_create_ports", dropping_tags)
    body = {"network_id": network.id, "project_id": project_id}
    with pytest.raises(NeutronRequestError, match="tag_ports_during_bulk_creation"):
        client.create_ports([body, body], "podwire-deployment=x")
    assert len(made) == 2 and not list(neutron.network.ports(network_id=network.id))
