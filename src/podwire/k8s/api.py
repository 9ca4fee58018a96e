"""The one place podwire speaks to the Kubernetes API, through kubernetes_asyncio.

Objects come back as raw JSON, never as the library's models: podwire's strict readers
(``objects.py``, ``netpol.py``) decide what is usable, so one odd object is skipped instead
of failing a whole list. Every library and transport error leaves as a ``KubeApiError``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import OpenApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from podwire.errors import ConfigError, KubeApiError, KubeResourceExpired

PAGE = 500
LIST_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0
MAX_LINE = 16 << 20  # an event carries one object: the apiserver stores up to 1.5 MiB each
GONE = 410
NOT_FOUND = 404
UNPROCESSABLE = 422  # a JSON patch whose test failed
CONFLICT = 409


@dataclass(frozen=True)
class ListPage:
    items: list[Any]
    resource_version: str
    next_page: str | None


class KubeApi:
    """Lists and watches of the kinds podwire follows, cluster-wide."""

    def __init__(self, api: kube_client.ApiClient) -> None:
        self._api = api
        self.server = str(api.configuration.host)
        self._core = kube_client.CoreV1Api(api)
        self._networking = kube_client.NetworkingV1Api(api)
        self._discovery = kube_client.DiscoveryV1Api(api)

    @classmethod
    async def from_kubeconfig(cls, path: Path) -> KubeApi:
        configuration = kube_client.Configuration()
        try:
            await kube_config.load_kube_config(
                config_file=str(path), client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise ConfigError(f"kubeconfig {path}: {_oneline(exc)}") from exc
        except Exception as exc:
            # The loader parses the operator's file with PyYAML (whose errors podwire does not
            # import) and walks what it finds: a YAML error or a document of the wrong shape
            # (TypeError, KeyError, ...) means alike that this is no usable kubeconfig.
            raise ConfigError(
                f"kubeconfig {path}: not a usable kubeconfig ({type(exc).__name__}:"
                f" {_oneline(exc)})"
            ) from exc
        return cls(kube_client.ApiClient(configuration))

    async def close(self) -> None:
        await self._api.close()

    def _call(self, kind: str) -> Any:
        return {
            "namespaces": self._core.list_namespace,
            "pods": self._core.list_pod_for_all_namespaces,
            "nodes": self._core.list_node,
            "networkpolicies": self._networking.list_network_policy_for_all_namespaces,
            "services": self._core.list_service_for_all_namespaces,
            "endpointslices": self._discovery.list_endpoint_slice_for_all_namespaces,
        }[kind]

    async def list_page(self, kind: str, next_page: str | None = None) -> ListPage:
        """One page of a consistent list; the last page's version is the list's."""
        options: dict[str, Any] = {"limit": PAGE}
        if next_page:
            options["_continue"] = next_page
        body = _checked(kind, *await _raw(kind, "list", self._call(kind), **options))
        meta = body.get("metadata") or {}
        items = body.get("items") or []
        version = meta.get("resourceVersion")
        if not isinstance(items, list) or not isinstance(version, str) or not version:
            raise KubeApiError(f"list of {kind}: no items or resourceVersion in the answer")
        token = meta.get("continue")
        return ListPage(items, version, token if isinstance(token, str) and token else None)

    async def pod(self, namespace: str, name: str) -> Any | None:
        """One pod as raw JSON, None when the API has no such pod: for a pod the informer's
        cache does not hold yet when its port is asked for."""
        read = self._core.read_namespaced_pod
        status, raw = await _raw("pods", "get", read, name, namespace)
        if status == NOT_FOUND:
            return None
        return _checked("pods", status, raw)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        """A core v1 Event as built by ``events.EventRecorder``; never patched afterwards."""
        create = self._core.create_namespaced_event
        _checked("events", *await _raw("events", "create", create, namespace, event))

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """A JSON merge patch of one pod: only the keys it names change (a null deletes).
        False when the API has no such pod, or another one under that name (a patch naming
        ``metadata.uid`` is refused 409 for a pod of another uid)."""
        status, raw = await _raw(
            "pods",
            "patch",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            patch,
            _content_type="application/merge-patch+json",
        )
        if status in (NOT_FOUND, CONFLICT):
            return False
        _checked("pods", status, raw)
        return True

    async def watch(
        self,
        kind: str,
        resource_version: str,
        seconds: int,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[bytes]:
        """The raw event lines of one watch request, from ``resource_version`` on, with
        bookmarks; ends when the apiserver closes it after ``seconds``. ``opened`` is called
        once the apiserver has accepted the request: an idle watch may carry no line for a
        minute, and whoever waits for the apiserver to come back should not wait that long."""
        async with _translated(kind, "watch"):
            response = await self._call(kind)(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT, seconds + 30),
            )
            try:
                if response.status != 200:
                    _checked(kind, response.status, await response.read())
                if opened is not None:
                    opened()
                async for line in _lines(response.content):
                    yield line
            finally:
                response.release()

    async def set_namespace_finalizers(
        self, name: str, finalizers: list[str], resource_version: str
    ) -> bool:
        """The namespace's metadata.finalizers, only if it is still at ``resource_version``;
        False when it changed meanwhile (the patch's test failed: nothing changed, so another
        writer's finalizer is never dropped) and the caller decides again on what it reads."""
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
        ]
        status, raw = await _raw(
            "namespaces",
            "patch",
            self._core.patch_namespace,
            name,
            patch,
            _content_type="application/json-patch+json",
        )
        if status in (CONFLICT, UNPROCESSABLE):
            return False
        _checked("namespaces", status, raw)
        return True


async def _raw(kind: str, verb: str, call: Any, *args: Any, **options: Any) -> tuple[int, bytes]:
    """One request's status and body as bytes: the client's calls are typed for its models,
    podwire sends and reads raw JSON (its own strict readers decide what it holds)."""
    options.setdefault("_request_timeout", LIST_TIMEOUT)
    async with _translated(kind, verb):
        response = await call(*args, _preload_content=False, **options)
        try:
            return response.status, await response.read()
        finally:
            response.release()


def _oneline(exc: BaseException) -> str:
    """A parser's multi-line message as one line: the process's refusal is one line."""
    return " ".join(str(exc).split())


def _checked(kind: str, status: int, raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KubeApiError(f"{kind}: HTTP {status}, not JSON") from exc
    if status == GONE:
        raise KubeResourceExpired(f"{kind}: {body.get('message', 'resourceVersion too old')}")
    if not 200 <= status <= 299 or not isinstance(body, dict):
        message = body.get("message") if isinstance(body, dict) else None
        raise KubeApiError(f"{kind}: HTTP {status}: {message or 'unexpected answer'}")
    return body


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited events, each bounded: aiohttp's own readline stops at 128 KiB."""
    pending = b""
    async for chunk in stream.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
        if len(pending) > MAX_LINE:
            raise KubeApiError(f"a watch event longer than {MAX_LINE} bytes")


@contextlib.asynccontextmanager
async def _translated(kind: str, verb: str) -> AsyncIterator[None]:
    """Transport and library errors of one call as ``KubeApiError``, naming the call."""
    try:
        yield
    except (aiohttp.ClientError, OpenApiException, TimeoutError) as exc:
        raise KubeApiError(f"{verb} {kind}: {type(exc).__name__}: {exc}") from exc
