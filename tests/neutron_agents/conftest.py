"""Fixtures of the Neutron-agent suite: namespaces, DHCP agents on the session's stack."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.neutron_agents.dhcp import DhcpAgentRun
from tests.scripted_agent import eventually


@pytest.fixture
def dhcp_agents(
    stack: dict[str, Any], neutron: Any, tmp_path: Path
) -> Iterator[Callable[..., DhcpAgentRun]]:
    """Starts DHCP agents; stops them and removes their records from Neutron afterwards."""
    runs: list[DhcpAgentRun] = []

    def start(host: str, netns: str, adopt_timeout: float = 10.0) -> DhcpAgentRun:
        out = tmp_path / f"dhcp-{host}.err"
        run = DhcpAgentRun(Path(stack["data_dir"]), host, netns, out, adopt_timeout)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()
        for agent in neutron.network.agents(host=run.host):
            neutron.network.delete_agent(agent)


async def alive_in_neutron(neutron: Any, host: str) -> None:
    async def alive() -> bool:
        return any(agent.is_alive for agent in neutron.network.agents(host=host))

    await eventually(alive, f"the DHCP agent of {host} reporting", timeout=90)
