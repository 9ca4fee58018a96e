"""The controller's API against generated requests from its own OpenAPI document (schemathesis).

Every generated request — valid, or mangled in any field the document describes — must be
answered with a documented status and never with a 5xx: bad input is the client's error, and
the controller keeps serving. The run uses the real controller, Neutron and etcd; the requests
are sent from a thread so that the controller keeps serving in this event loop meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests.controller.conftest import ADMIN, ScriptedNodes, settings_for

EXAMPLES = 40


def _fuzz(
    url: str, document: dict[str, Any], node: str, token: str, seen: Counter[int]
) -> list[str]:
    schema = schemathesis.openapi.from_dict(document)
    problems: list[str] = []
    for (path, _), operation in _operations(schema):
        token_for = (
            ADMIN if path.startswith(("/v1/pools", "/v1/networks", "/v1/security")) else token
        )
        _checker(operation, url, {"Authorization": f"Bearer {token_for}"}, node, problems, seen)()
    return problems


def _checker(
    operation: Any,
    url: str,
    headers: dict[str, str],
    node: str,
    problems: list[str],
    seen: Counter[int],
) -> Any:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        if "node" in (case.path_parameters or {}):
            case.path_parameters["node"] = node  # the token's own node, to get past auth
        response = case.call(base_url=url, headers=headers, timeout=30)
        seen[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            where = f"{operation.method.upper()} {operation.path}"
            problems.append(f"{where}: {response.status_code} {response.text[:200]}")

    return check


def _operations(schema: Any) -> list[tuple[tuple[str, str], Any]]:
    found = []
    for result in schema.get_all_operations():
        operation = result.ok()
        found.append(((operation.path, operation.method.upper()), operation))
    return found


@pytest.mark.stack
async def test_generated_requests_get_client_errors_never_server_errors(
    stack: dict[str, Any], nodes: ScriptedNodes, controllers: Any
) -> None:
    node = await nodes.add()
    running = await controllers(settings_for(stack, [node], min=0))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/openapi.json") as response:
            document = await response.json()
        seen: Counter[int] = Counter()
        problems = await asyncio.to_thread(
            _fuzz, running.url, document, node.name, node.token, seen
        )
        assert problems == []
        # The run reached past validation (some 2xx) and its mangled requests were refused.
        assert seen[400] > 0 and any(200 <= code < 300 for code in seen), seen
        async with http.get(f"{running.url}/healthz") as health:  # still serving after it all
            assert health.status == 200
