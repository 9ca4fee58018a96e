"""Fixtures of the Neutron-agent suite: DHCP and L3 agents on the session's stack."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.neutron_agents.agents import NeutronAgentRun
from tests.scripted_agent import eventually

DHCP_AGENT = "DHCP agent"
L3_AGENT = "L3 agent"


AGENT_TYPES = {"dhcp": DHCP_AGENT, "l3": L3_AGENT}


def _agent_runs(
    kind: str, stack: dict[str, Any], neutron: Any, tmp_path: Path
) -> Iterator[Callable[..., NeutronAgentRun]]:
    """Starts agents of ``kind``; stops them and removes their records from Neutron after."""
    runs: list[NeutronAgentRun] = []

    def start(host: str, netns: str, adopt_timeout: float = 10.0) -> NeutronAgentRun:
        out = tmp_path / f"{kind}-{host}.err"
        run = NeutronAgentRun(Path(stack["data_dir"]), host, netns, out, adopt_timeout, kind)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()
        for agent in neutron.network.agents(host=run.host, agent_type=AGENT_TYPES[kind]):
            neutron.network.delete_agent(agent)


@pytest.fixture
def dhcp_agents(
    stack: dict[str, Any], neutron: Any, tmp_path: Path
) -> Iterator[Callable[..., NeutronAgentRun]]:
    yield from _agent_runs("dhcp", stack, neutron, tmp_path)


@pytest.fixture
def l3_agents(
    stack: dict[str, Any], neutron: Any, tmp_path: Path
) -> Iterator[Callable[..., NeutronAgentRun]]:
    yield from _agent_runs("l3", stack, neutron, tmp_path)


async def alive_in_neutron(neutron: Any, host: str, agent_type: str = DHCP_AGENT) -> None:
    async def alive() -> bool:
        agents = neutron.network.agents(host=host, agent_type=agent_type)
        return any(agent.is_alive for agent in agents)

    await eventually(alive, f"the {agent_type} of {host} reporting", timeout=90)
