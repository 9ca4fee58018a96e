"""``podwire pools`` over the admin API and ``podwire controller`` argument handling."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest

from podwire.cli import controller_cmd, pools_cmd
from podwire.errors import ConfigError, PermanentError
from tests.controller.conftest import ADMIN, ScriptedNodes, settings_for


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    pools_cmd.register(subparsers)
    controller_cmd.register(subparsers)
    return parser.parse_args(argv)


async def test_pools_cli_populate_list_free(
    stack: dict[str, Any],
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    base = ["pools", "--url", running.url, "--token", ADMIN]

    async def cli(*argv: str) -> Any:
        args = parse([*base, *argv])
        assert await asyncio.to_thread(args.handler, args) == 0
        return json.loads(capsys.readouterr().out)

    out = await cli("populate", "--node", node.name, "--network", network.id, "--count", "2")
    assert out == {"created": {node.name: 2}}
    listed = await cli("list")
    assert [p["size"] for p in listed["pools"]] == [2]
    shown = await cli("show", node.name, network.project_id, network.id)
    assert shown["key"]["node"] == node.name
    assert await cli("free", "--node", node.name) == {"freed": 2}
    bad = parse([*base, "populate", "--node", node.name, "--network", network.id, "--count", "0"])
    with pytest.raises(PermanentError, match="count"):
        await asyncio.to_thread(bad.handler, bad)


def test_controller_needs_tokens(tmp_path: Any) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[neutron]\nendpoint = "http://127.0.0.1:9/"\n')
    args = parse(["controller", "--config", str(config)])
    with pytest.raises(ConfigError, match="token"):
        args.handler(args)
