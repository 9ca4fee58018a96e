"""Records written before attachment ids were ``<container>:<ifname>`` keep their meaning.

A ``.``-joined id was ambiguous (``a.b``+``c`` and ``a``+``b.c`` are one key), so ids are now
joined with ``:``, which neither part can contain. A controller moves the records it finds
under old keys on recovery; agents (and old agents still sending the old form) reach them
under the new id.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from podwire import keys
from podwire.etcd.client import EtcdClient
from tests.controller.conftest import (
    ScriptedNodes,
    release_vif,
    request_vif,
    settings_for,
    vif_body,
)

pytestmark = pytest.mark.stack

CID = "0a1b2c3d" * 8


async def test_legacy_in_use_records_are_moved_to_canonical_ids(
    stack: dict[str, Any],
    etcd: EtcdClient,
    network: Any,
    nodes: ScriptedNodes,
    controllers: Any,
    http: aiohttp.ClientSession,
) -> None:
    node = await nodes.add()
    settings = settings_for(stack, [node], min=0)
    first = await controllers(settings)
    status, used = await request_vif(http, first.url, node, vif_body(f"{CID}:eth0", network))
    assert status == 200, used
    await first.stop()
    # What an older controller left: the same record under the dot-joined key.
    new_key, old_key = keys.vif(node.name, f"{CID}:eth0"), keys.vif(node.name, f"{CID}.eth0")
    record = await etcd.get(new_key)
    assert record is not None
    await etcd.put(old_key, record.value)
    await etcd.delete(new_key)

    second = await controllers(settings)
    assert await etcd.get(old_key) is None
    moved = await etcd.get(new_key)
    assert moved is not None and moved.value == record.value
    # An old agent still asking with the dot form gets the same port, not a second one.
    status, again = await request_vif(http, second.url, node, vif_body(f"{CID}.eth0", network))
    assert status == 200 and again["vif"] == used["vif"]
    async with http.get(
        f"{second.url}/v1/nodes/{node.name}/vifs",
        headers={"Authorization": f"Bearer {node.token}"},
    ) as response:
        assert list((await response.json())["attachments"]) == [f"{CID}:eth0"]
    assert await release_vif(http, second.url, node, f"{CID}.eth0") == 204
    assert await etcd.get(new_key) is None
