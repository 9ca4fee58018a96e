"""The stack's etcd members (no process started): names, peers, ports, data dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from podwire.errors import StackError
from podwire.stack import etcd_server


def test_one_member_is_named_and_placed_as_before(tmp_path: Path) -> None:
    (member,) = etcd_server.cluster(tmp_path, {}, 1)
    assert (member.name, member.data_dir, member.initial_cluster) == (
        "podwire",
        tmp_path / "etcd",
        "",
    )
    assert etcd_server.child_name(member, 1) == "etcd"
    assert set(etcd_server.port_entries([member])) == {"etcd", "etcd_peer"}


def test_a_cluster_names_every_member_and_peer(tmp_path: Path) -> None:
    members = etcd_server.cluster(tmp_path, {}, 3)
    assert [m.name for m in members] == ["etcd-1", "etcd-2", "etcd-3"]
    assert [m.data_dir for m in members] == [tmp_path / f"etcd-{i}" for i in (1, 2, 3)]
    ports = etcd_server.port_entries(members)
    assert len(set(ports.values())) == 6  # every client and peer port distinct
    argv = members[1].argv()
    cluster = argv[argv.index("--initial-cluster") + 1]
    assert cluster == ",".join(f"{m.name}={m.peer_url}" for m in members)
    # a restart keeps the ports it had while they are free
    again = etcd_server.cluster(tmp_path, ports, 3)
    assert etcd_server.port_entries(again) == ports


def test_a_data_dir_keeps_its_member_count(tmp_path: Path) -> None:
    (tmp_path / "etcd").mkdir()
    with pytest.raises(StackError, match="is a single member: start it with the same"):
        etcd_server.cluster(tmp_path, {}, 3)
