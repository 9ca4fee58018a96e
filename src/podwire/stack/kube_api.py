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


def _send(url: str, context: ssl.SSLContext, method: str, path: str, body: object = None) -> int:
    """One request as the admin; returns the HTTP status (an error status too: what it
    means is the caller's to say); raises when the apiserver cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{url}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"kube-apiserver unreachable for {method} {path}: {exc}") from exc


def _refused(method: str, path: str, status: int) -> StackError:
    return StackError(f"kube-apiserver refused {method} {path}: {status}")


def create_if_absent(url: str, context: ssl.SSLContext, path: str, body: object) -> None:
    """POST ``body``; an object of that name already there (a restarted stack) is kept."""
    status = _send(url, context, "POST", path, body)
    if status >= 300 and status != 409:
        raise _refused("POST", path, status)


def ensure(url: str, context: ssl.SSLContext, collection: str, name: str, body: object) -> None:
    """``body`` made unless an object of that name is there (a restarted stack's): asked
    first, since some kinds refuse a second create with 422 rather than 409 (a Service whose
    cluster IP its first self holds)."""
    status = _send(url, context, "GET", f"{collection}/{name}")
    if status == 404:
        create_if_absent(url, context, collection, body)
    elif status >= 300:
        raise _refused("GET", f"{collection}/{name}", status)


def put(url: str, context: ssl.SSLContext, path: str, body: object) -> None:
    """PUT ``body`` (made or replaced, unconditionally): a restarted stack's own object,
    whose contents may have changed (a new port)."""
    status = _send(url, context, "PUT", path, body)
    if status == 404:  # PUT makes only some kinds: create it
        create_if_absent(url, context, path.rsplit("/", 1)[0], body)
    elif status >= 300:
        raise _refused("PUT", path, status)


def grant_kubelet_client(url: str, context: ssl.SSLContext) -> None:
    """Lets the apiserver's kubelet client identity use the kubelets' API (exec, logs)."""
    body = binding("podwire:kube-apiserver-kubelet-client", KUBELET_API_ROLE, KUBELET_CLIENT.name)
    create_if_absent(url, context, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body)
