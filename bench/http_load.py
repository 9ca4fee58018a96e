"""Warm VIF requests from a process of their own, as agents on other machines send them.

A client in the controller's process would share its GIL, and the figure would be half client.
Each round waits until the node's pool holds ``ports`` free ports, sends that many concurrent
VIF requests (pool hits), times them, then releases them all through the API (they are
recycled into the pool again). Prints one JSON line: ``{"rates": [requests/s per round]}``.

``python -m bench.http_load URL NODE TOKEN ADMIN_TOKEN NETWORK PROJECT PORTS ROUNDS``
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp


class Load:
    def __init__(self, http: aiohttp.ClientSession, argv: list[str]) -> None:
        self.http = http
        self.url, self.node, token, admin, self.network, self.project = argv[:6]
        self.ports, self.rounds = int(argv[6]), int(argv[7])
        self.node_auth = {"Authorization": f"Bearer {token}"}
        self.admin_auth = {"Authorization": f"Bearer {admin}"}
        self.vifs = f"{self.url}/v1/nodes/{self.node}/vifs"

    async def run(self) -> list[float]:
        rates = []
        for r in range(self.rounds):
            await self.wait_pooled()
            names = [f"h{r}-{i}:eth0" for i in range(self.ports)]
            started = time.perf_counter()
            await asyncio.gather(*(self.request(name) for name in names))
            rates.append(self.ports / (time.perf_counter() - started))
            await asyncio.gather(*(self.release(name) for name in names))
        return rates

    async def request(self, name: str) -> None:
        body = {"attachment": name, "network": self.network, "project_id": self.project}
        async with self.http.post(self.vifs, json=body, headers=self.node_auth) as resp:
            if resp.status != 200:
                raise RuntimeError(f"VIF request {name}: {resp.status} {await resp.text()}")

    async def release(self, name: str) -> None:
        async with self.http.delete(f"{self.vifs}/{name}", headers=self.node_auth) as resp:
            if resp.status not in (200, 204):
                raise RuntimeError(f"VIF release {name}: {resp.status} {await resp.text()}")

    async def wait_pooled(self) -> None:
        pool = f"{self.url}/v1/pools/{self.node}/{self.project}/{self.network}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            async with self.http.get(pool, headers=self.admin_auth) as resp:
                shown: dict[str, Any] = await resp.json()
            if int(shown.get("size", 0)) >= self.ports:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"pool {pool} did not hold {self.ports} free ports within 60 s")


async def main(argv: list[str]) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        rates = await Load(http, argv).run()
    print(json.dumps({"rates": rates}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
