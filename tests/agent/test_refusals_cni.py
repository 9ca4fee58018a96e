"""The controller's refusals reach the runtime as CNI code 7 with the controller's message,
at once (no retry until the ADD's deadline), and leave nothing behind (real controller,
agent, plugin and Neutron)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from podwire.cni import spec
from podwire.controller.app import Controller
from tests.agent.harness import HostAgent, acni
from tests.agent.netenv import NetEnv, links_in
from tests.agent.test_with_controller import pooled  # noqa: F401  (the fixture)
from tests.controller.conftest import Node

pytestmark = pytest.mark.stack


async def test_permanent_refusals_are_code_7_naming_the_cause(
    pooled: tuple[Controller, HostAgent, Node],  # noqa: F811
    netenv: NetEnv,
    vxnet: Any,
    plugin: Path,
    neutron: Any,
    project_id: str,
) -> None:
    _, agent, _ = pooled
    other = uuid.uuid4().hex
    foreign_sg = neutron.network.create_security_group(project_id=other, name="theirs")
    twin = neutron.network.create_network(project_id=project_id, name="pw-agent-a")
    bare = neutron.network.create_network(project_id=project_id, name="pw-bare")
    ns = netenv.namespace("ref")
    cases = [
        ({"network": vxnet.id, "project": project_id, "securityGroups": [foreign_sg.id]},
         foreign_sg.id),
        ({"network": "pw-agent-a", "project": project_id}, "ambiguous"),
        ({"network": bare.id}, "has no subnet"),
    ]  # fmt: skip
    try:
        for extra, named in cases:
            conf = {**agent.conf(vxnet.id), **extra}
            started = time.monotonic()
            add = await acni(
                plugin, "ADD", conf, container_id=uuid.uuid4().hex, netns=f"/run/netns/{ns}"
            )
            assert add.code == spec.INVALID_CONFIG, add.stdout
            assert named in add.json["msg"], add.stdout
            # refused at once, not retried until the ADD's deadline
            assert time.monotonic() - started < agent.settings().agent.cni_timeout / 2
            assert links_in(ns) == ["lo"]
    finally:
        neutron.network.delete_network(twin)
        neutron.network.delete_network(bare)
        neutron.network.delete_security_group(foreign_sg)
