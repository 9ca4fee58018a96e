"""The stack's own calls to its Kubernetes apiserver, as the admin: readiness and the one
object it adds to the bootstrap policy.

Plain HTTPS with the admin's client cert: the stack needs two requests, not a client library.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from podwire.errors import StackError
from podwire.stack.kube_pki import KUBELET_CLIENT, Pki
from podwire.stack.netutil import http_ok

# The built-in role for whoever calls kubelets' API: the apiserver, for exec, logs, port-forward.
KUBELET_API_ROLE = "system:kubelet-api-admin"


def admin_context(pki: Pki) -> ssl.SSLContext:
    """Verifies the apiserver against the stack's CA and presents the admin's cert."""
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    admin = pki.pair("admin")
    context.load_cert_chain(str(admin.cert), str(admin.key))
    return context


def loopback_context() -> ssl.SSLContext:
    """For the controller manager's and scheduler's health checks on loopback: they serve a
    self-signed cert made at start, which nothing could verify."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def ready(url: str, context: ssl.SSLContext) -> bool:
    return http_ok(f"{url}/readyz", timeout=5, context=context)


def healthy(port: int) -> bool:
    return http_ok(f"https://127.0.0.1:{port}/healthz", timeout=5, context=loopback_context())


def binding(name: str, role: str, user: str) -> dict[str, object]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "podwire-stack"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def create_if_absent(url: str, context: ssl.SSLContext, path: str, body: object) -> None:
    """POST ``body``; an object of that name already there (a restarted stack) is kept."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            return
    except urllib.error.HTTPError as exc:
        if exc.code == 409:
            return
        raise StackError(f"kube-apiserver refused POST {path}: {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"kube-apiserver unreachable for POST {path}: {exc}") from exc


def ensure(url: str, context: ssl.SSLContext, collection: str, name: str, body: object) -> None:
    """``body`` made unless an object of that name is there (a restarted stack's): asked
    first, since some kinds refuse a second create with 422 rather than 409 (a Service whose
    cluster IP its first self holds)."""
    request = urllib.request.Request(f"{url}{collection}/{name}", method="GET")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            return
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise StackError(f"kube-apiserver refused GET {collection}/{name}: {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"kube-apiserver unreachable for GET {collection}/{name}: {exc}") from exc
    create_if_absent(url, context, collection, body)


def put(url: str, context: ssl.SSLContext, path: str, body: object) -> None:
    """PUT ``body`` (made or replaced, unconditionally): a restarted stack's own object,
    whose contents may have changed (a new port)."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            return
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # PUT makes only some kinds: create it
            collection = path.rsplit("/", 1)[0]
            create_if_absent(url, context, collection, body)
            return
        raise StackError(f"kube-apiserver refused PUT {path}: {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"kube-apiserver unreachable for PUT {path}: {exc}") from exc


def grant_kubelet_client(url: str, context: ssl.SSLContext) -> None:
    """Lets the apiserver's kubelet client identity use the kubelets' API (exec, logs)."""
    body = binding("podwire:kube-apiserver-kubelet-client", KUBELET_API_ROLE, KUBELET_CLIENT.name)
    create_if_absent(url, context, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body)
