from __future__ import annotations

import aiohttp
import prometheus_client

from podwire.ops_http import OpsServer


async def test_health_ready_and_metrics() -> None:
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter("podwire_test_things", "things", registry=registry)
    counter.inc(3)
    state = {"ready": False}

    async def ready() -> tuple[bool, str]:
        return state["ready"], "recovering" if not state["ready"] else "ok"

    server = OpsServer("127.0.0.1:0", ready, registry)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/healthz") as response:
                assert response.status == 200
            async with session.get(base + "/readyz") as response:
                assert response.status == 503
                assert (await response.json())["detail"] == "recovering"
            state["ready"] = True
            async with session.get(base + "/readyz") as response:
                assert response.status == 200
            async with session.get(base + "/metrics") as response:
                assert "podwire_test_things_total 3.0" in await response.text()
    finally:
        await server.stop()
