"""deploy/ against the real kube-apiserver of ``podwire stack up --kubernetes`` (the session's
``kube_stack``): every object, its ``REPLACE-...`` values filled in, is accepted by a
server-side dry run (strict field validation, defaulting, validation and admission: what the
offline schemas of test_manifests.py cannot see). The Namespace, ServiceAccounts and RBAC
objects are then applied for real (the workloads are not: there is no image), and each
component's ServiceAccount may do what its code needs (``NEEDS``) and nothing more: its rules,
read back with a token of its own, are those of a ServiceAccount nobody bound anything to plus
what deploy/ binds to it, and calls it must never make are refused by the apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from podwire.k8s.api import KubeApi
from podwire.k8s.reach import ApiReach
from podwire.k8s.watcher import KubeWatcher
from tests.deploy.manifests import NEEDS, documents

# The stack marker comes from the kube_stack fixture (tests/conftest.py).
pytestmark = [pytest.mark.slow]

NAMESPACE = "podwire"
FIELD_MANAGER = "podwire-deploy-test"
# Applied for real: what gives the components their identities and their rights.
IDENTITY_KINDS = frozenset(
    {"Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
)
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
# A ServiceAccount no binding names (it need not exist to be impersonated): what any service
# account of this cluster may do before deploy/ grants it anything (discovery, health, its own
# access reviews).
BASELINE = "system:serviceaccount:pw-deploy-baseline:nobody"
# Where the rules are compared: podwire's namespace, the system's, a tenant's.
NAMESPACES = (NAMESPACE, "kube-system", "default")
PLACEHOLDER = re.compile(r"REPLACE(?:-[A-Z0-9]+)*")
NAMES = [name for name, _ in documents()]

# (API group, or "url" for a non-resource URL; resource or URL; resource name or ""; verb)
Atom = tuple[str, str, str, str]

# Calls a component must never make, checked with `kubectl auth can-i`: (ServiceAccount, verb,
# resource, namespace; "" for every namespace and for cluster-scoped resources).
FORBIDDEN = [
    ("podwire-agent", "list", "secrets", ""),
    ("podwire-agent", "get", "secrets", NAMESPACE),  # other nodes' credentials
    ("podwire-agent", "delete", "nodes", ""),
    ("podwire-agent", "patch", "nodes", ""),
    ("podwire-agent", "create", "pods", "kube-system"),
    ("podwire-agent", "create", "pods/exec", "kube-system"),
    ("podwire-agent", "create", "serviceaccounts/token", NAMESPACE),
    ("podwire-agent", "impersonate", "users", ""),
    ("podwire-controller", "get", "secrets", "kube-system"),
    ("podwire-controller", "get", "secrets", "default"),
    ("podwire-controller", "list", "secrets", ""),
    ("podwire-controller", "get", "secrets", NAMESPACE),  # the kubelet hands it its own
    ("podwire-controller", "create", "pods", NAMESPACE),
    ("podwire-controller", "delete", "namespaces", ""),
    ("podwire-controller", "update", "networkpolicies.networking.k8s.io", ""),
    ("podwire-controller", "create", "networkpolicies.networking.k8s.io", NAMESPACE),
    ("podwire-controller", "delete", "networkpolicies.networking.k8s.io", ""),
    ("podwire-controller", "update", "pods", ""),
    ("podwire-controller", "patch", "events", ""),
    ("podwire-controller", "delete", "events", ""),
    ("podwire-controller", "patch", "nodes", ""),
    ("podwire-controller", "delete", "nodes", ""),
    ("podwire-controller", "delete", "pods", "default"),
    ("podwire-controller", "update", "namespaces", ""),
    ("podwire-controller", "watch", "secrets", ""),
    ("podwire-controller", "list", "configmaps", ""),
    ("podwire-controller", "update", "services", ""),
    ("podwire-controller", "delete", "endpointslices.discovery.k8s.io", ""),
    ("podwire-controller", "bind", "clusterroles.rbac.authorization.k8s.io", ""),
]

# The same kind of calls as real requests with the component's own token.
REFUSED_REQUESTS = [
    ("podwire-agent", "GET", "/api/v1/secrets"),
    ("podwire-agent", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/podwire-nodes"),
    ("podwire-agent", "DELETE", "/api/v1/nodes/pw-deploy-no-such-node"),
    ("podwire-agent", "POST", "/api/v1/namespaces/kube-system/pods"),
    ("podwire-controller", "GET", "/api/v1/secrets"),
    ("podwire-controller", "GET", "/api/v1/namespaces/kube-system/secrets"),
    ("podwire-controller", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/podwire-controller"),
    ("podwire-controller", "GET", "/api/v1/secrets?watch=true"),
    ("podwire-controller", "GET", "/api/v1/configmaps"),
    ("podwire-controller", "POST", "/api/v1/namespaces/default/pods"),
    ("podwire-controller", "DELETE", "/api/v1/namespaces/default/pods/pw-deploy-no-such-pod"),
]
A_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "pw-deploy-forbidden"},
    "spec": {"containers": [{"name": "c", "image": "localhost/none:latest"}]},
}


def eventually(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.25)
    return check()


def account_user(account: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{account}"


@dataclass
class Cluster:
    """The stack's apiserver: kubectl as the admin, plain HTTPS with a bearer token."""

    info: dict[str, Any]
    context: ssl.SSLContext = field(init=False)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(cafile=str(self.ca_file))

    @property
    def ca_file(self) -> Path:
        """The stack's CA (DIR/kube/pki/ca.crt, beside the admin's kubeconfig)."""
        return Path(self.info["kubeconfig"]).parent / "pki" / "ca.crt"

    def kubectl(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        binary = Path(self.info["kube_bin_dir"]) / "kubectl"
        argv = [str(binary), "--kubeconfig", self.info["kubeconfig"], "--request-timeout=20s"]
        return subprocess.run(
            [*argv, *args], input=stdin, capture_output=True, text=True, timeout=60
        )

    def ok(self, *args: str, stdin: str = "") -> str:
        done = self.kubectl(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def apply(self, doc: dict[str, Any], *, dry_run: bool) -> subprocess.CompletedProcess[str]:
        """Server-side apply with the server's strict field validation."""
        args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--validate=strict"]
        if dry_run:
            args.append("--dry-run=server")
        return self.kubectl(*args, "-o", "json", "-f", "-", stdin=json.dumps(doc))

    def exists(self, doc: dict[str, Any]) -> bool:
        group = doc["apiVersion"].rpartition("/")[0]
        kind = f"{doc['kind'].lower()}.{group}" if group else doc["kind"].lower()
        where = [] if doc["kind"] in CLUSTER_SCOPED else ["-n", doc["metadata"]["namespace"]]
        out = self.ok("get", kind, doc["metadata"]["name"], *where, "--ignore-not-found", "-o=name")
        return bool(out.strip())

    def call(
        self, method: str, path: str, token: str, body: object = None
    ) -> tuple[int, dict[str, Any]]:
        """One request with a bearer token: (status, the JSON answer)."""
        request = urllib.request.Request(
            f"{self.info['kube_apiserver']}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=20, context=self.context) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def rules_with_token(self, token: str, namespace: str) -> set[Atom]:
        status, review = self.call(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", token,
            _rules_review(namespace),
        )  # fmt: skip
        assert status == 201, review
        return _atoms_of_review(review)

    def rules_as(self, user: str, namespace: str) -> set[Atom]:
        out = self.ok(
            "create", "--raw", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            "-f", "-", f"--as={user}", stdin=json.dumps(_rules_review(namespace)),
        )  # fmt: skip
        return _atoms_of_review(json.loads(out))


def _rules_review(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }


def atoms(rule: dict[str, Any]) -> set[Atom]:
    """A PolicyRule as the single permissions it grants."""
    verbs = rule.get("verbs") or []
    if rule.get("nonResourceURLs"):
        return {("url", url, "", verb) for url in rule["nonResourceURLs"] for verb in verbs}
    return {
        (group, resource, name, verb)
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for name in rule.get("resourceNames") or [""]
        for verb in verbs
    }


def _atoms_of_review(review: dict[str, Any]) -> set[Atom]:
    status = review["status"]
    assert status.get("incomplete") is False, status
    found: set[Atom] = set()
    for rule in [*status.get("resourceRules", []), *status.get("nonResourceRules", [])]:
        found |= atoms(rule)
    return found


def needed(account: str, namespace: str) -> set[Atom]:
    return {
        (group, resource, "", verb)
        for verb, group, resource, scope in NEEDS[account]
        if scope in ("", namespace)
    }


def _names_account(subject: dict[str, Any], account: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return bool(name == account and subject.get("namespace") == NAMESPACE)
    if kind == "User":
        return name == account_user(account)
    groups = {
        "system:authenticated",
        "system:serviceaccounts",
        f"system:serviceaccounts:{NAMESPACE}",
    }
    return kind == "Group" and name in groups


def granted_by_deploy(
    cluster: Cluster, docs: dict[str, dict[str, Any]], account: str, namespace: str
) -> set[Atom]:
    """What deploy/'s bindings give ``account`` in ``namespace``: the rules of the roles they
    name, as the apiserver has them (built-in and aggregated roles included)."""
    found: set[Atom] = set()
    for doc in docs.values():
        if doc["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if doc["kind"] == "RoleBinding" and doc["metadata"]["namespace"] != namespace:
            continue
        if not any(_names_account(s, account) for s in doc.get("subjects") or []):
            continue
        ref = doc["roleRef"]
        where = ["-n", namespace] if ref["kind"] == "Role" else []
        role = json.loads(cluster.ok("get", ref["kind"].lower(), ref["name"], *where, "-o=json"))
        for rule in role.get("rules") or []:
            found |= atoms(rule)
    return found


def fill_placeholders(
    docs: list[tuple[str, dict[str, Any]]], ca_pem: str
) -> dict[str, dict[str, Any]]:
    """deploy/'s objects with every ``REPLACE...`` value replaced by a valid test value, the
    same placeholder by the same value everywhere (a node's token in both Secrets)."""
    values: dict[str, str] = {}

    def value(placeholder: str) -> str:
        if placeholder not in values:
            if placeholder.endswith("-CERTIFICATE"):
                values[placeholder] = ca_pem.strip()
            elif placeholder.endswith("-ID"):
                values[placeholder] = str(uuid.uuid4())
            else:
                values[placeholder] = f"pw{secrets.token_hex(16)}"
        return values[placeholder]

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return PLACEHOLDER.sub(lambda found: value(found.group(0)), node)
        if isinstance(node, dict):
            return {key: walk(item) for key, item in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return {name: walk(doc) for name, doc in docs}


@pytest.fixture(scope="module")
def cluster(kube_stack: dict[str, Any]) -> Cluster:
    return Cluster(kube_stack)


@pytest.fixture(scope="module")
def filled(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return fill_placeholders(documents(), cluster.ca_file.read_text())


@pytest.fixture(scope="module")
def installed(cluster: Cluster, filled: dict[str, dict[str, Any]]) -> Iterator[Cluster]:
    """deploy/'s Namespace, ServiceAccounts and RBAC objects applied for real (the Namespace
    first: it comes first in deploy/); removed afterwards, the Namespace finalized by the
    controller manager."""
    identity = [doc for doc in filled.values() if doc["kind"] in IDENTITY_KINDS]
    assert identity[0]["kind"] == "Namespace"
    try:
        for doc in identity:
            done = cluster.apply(doc, dry_run=False)
            assert done.returncode == 0, done.stderr
        yield cluster
    finally:
        for doc in identity:
            if doc["kind"] in CLUSTER_SCOPED - {"Namespace"}:
                cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"])
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found")
        assert eventually(
            lambda: not cluster.ok("get", "namespace", NAMESPACE, "--ignore-not-found").strip(),
            timeout=120,
        ), cluster.kubectl("get", "namespace", NAMESPACE, "-o", "yaml").stdout


@pytest.fixture(scope="module")
def tokens(installed: Cluster) -> dict[str, str]:
    """A short-lived token of each component's ServiceAccount, from the TokenRequest API."""
    return {
        account: installed.ok("create", "token", account, "-n", NAMESPACE, "--duration=10m").strip()
        for account in NEEDS
    }


def test_the_placeholders_get_valid_values(filled: dict[str, dict[str, Any]]) -> None:
    originals = json.dumps([doc for _, doc in documents()])
    assert PLACEHOLDER.search(originals), "deploy/ has no REPLACE-... value left to fill"
    assert "REPLACE" not in json.dumps(list(filled.values()))
    controller = filled["20-secrets.yaml:Secret/podwire-controller"]["stringData"]
    nodes = filled["20-secrets.yaml:Secret/podwire-nodes"]["stringData"]
    assert json.loads(controller["node-tokens"]) == {"node-1": nodes["node-1.token"]}
    cloud = yaml.safe_load(controller["clouds.yaml"])["clouds"]["podwire"]
    assert cloud["auth"]["password"] not in (None, "")
    ca = filled["20-secrets.yaml:Secret/podwire-etcd-ca"]["stringData"]["ca.pem"]
    ssl.create_default_context(cadata=ca)  # a certificate, not just text
    config = filled["10-config.yaml:ConfigMap/podwire-config"]["data"]
    uuid.UUID(config["cni-network"]), uuid.UUID(config["cni-project"])  # ids Neutron could have


@pytest.mark.parametrize("name", NAMES)
def test_every_object_is_accepted_by_the_real_apiserver(
    installed: Cluster, filled: dict[str, dict[str, Any]], name: str
) -> None:
    """kubectl apply --server-side --dry-run=server: no error and no warning (deprecated fields,
    Pod Security), and a dry run leaves nothing behind."""
    doc = filled[name]
    done = installed.apply(doc, dry_run=True)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["kind"], answer["metadata"]["name"]) == (doc["kind"], doc["metadata"]["name"])
    if doc["kind"] not in IDENTITY_KINDS:
        assert not installed.exists(doc)


def test_the_apiserver_refuses_what_the_offline_schemas_let_through(
    installed: Cluster, filled: dict[str, dict[str, Any]]
) -> None:
    """The dry run above can fail: a DaemonSet whose selector misses its pods' labels passes
    the schemas and is refused by the apiserver, as is a misspelt field."""
    agent = filled["30-agent.yaml:DaemonSet/podwire-agent"]
    orphaning = copy.deepcopy(agent)
    orphaning["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "other"
    kubernetes_validate.validate(orphaning, kubernetes_validate.latest_version(), strict=True)
    done = installed.apply(orphaning, dry_run=True)
    assert done.returncode != 0
    assert "`selector` does not match template `labels`" in done.stderr

    misspelt = copy.deepcopy(agent)
    misspelt["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    done = installed.apply(misspelt, dry_run=True)
    assert done.returncode != 0
    assert "volumeMount: field not declared in schema" in done.stderr


def unexplained(
    cluster: Cluster,
    docs: dict[str, dict[str, Any]],
    account: str,
    token: str,
    namespace: str,
) -> tuple[set[Atom], set[Atom]]:
    """(what the account may do beyond the baseline and deploy/'s grants, what it may not of
    those) in ``namespace``, from a rules review made with its own token."""
    expected = cluster.rules_as(BASELINE, namespace) | granted_by_deploy(
        cluster, docs, account, namespace
    )
    actual = cluster.rules_with_token(token, namespace)
    return actual - expected, expected - actual


@pytest.mark.parametrize("account", sorted(NEEDS))
def test_each_component_may_do_what_it_needs_and_nothing_more(
    installed: Cluster, filled: dict[str, dict[str, Any]], tokens: dict[str, str], account: str
) -> None:
    status, who = installed.call(
        "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", tokens[account],
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )  # fmt: skip
    assert status == 201, who
    assert who["status"]["userInfo"]["username"] == account_user(account)
    for verb, group, resource, scope in sorted(NEEDS[account]):
        where = ["-n", scope] if scope else ["-A"]
        answer = installed.kubectl(
            "auth", "can-i", verb, f"{resource}.{group}".rstrip("."), *where,
            f"--as={account_user(account)}",
        )  # fmt: skip
        assert answer.stdout.strip() == "yes", (verb, group, resource, scope, answer.stderr)
    for namespace in NAMESPACES:
        assert granted_by_deploy(installed, filled, account, namespace) == needed(
            account, namespace
        ), f"deploy/ grants {account} other rights than its code needs in {namespace}"
        extra, missing = unexplained(installed, filled, account, tokens[account], namespace)
        assert (extra, missing) == (set(), set()), namespace


@pytest.mark.parametrize(
    ("account", "verb", "resource", "namespace"),
    FORBIDDEN,
    ids=[f"{a}-{v}-{r}-{n or 'all'}" for a, v, r, n in FORBIDDEN],
)
def test_calls_a_component_must_never_make_are_refused(
    installed: Cluster, account: str, verb: str, resource: str, namespace: str
) -> None:
    where = ["-n", namespace] if namespace else ["-A"]
    # The question is well formed: the admin may, and kubectl knows the resource.
    admin = installed.kubectl("auth", "can-i", verb, resource, *where)
    assert (admin.stdout.strip(), admin.stderr) == ("yes", "")
    answer = installed.kubectl(
        "auth", "can-i", verb, resource, *where, f"--as={account_user(account)}"
    )
    assert (answer.stdout.strip(), answer.returncode, answer.stderr) == ("no", 1, "")


@pytest.mark.parametrize(
    ("account", "method", "path"),
    REFUSED_REQUESTS,
    ids=[f"{a}-{m}-{p}" for a, m, p in REFUSED_REQUESTS],
)
def test_real_requests_with_the_components_token_are_refused(
    installed: Cluster, tokens: dict[str, str], account: str, method: str, path: str
) -> None:
    """403 (authenticated, not authorized), naming the component's identity."""
    body = A_POD if method == "POST" else None
    status, answer = installed.call(method, path, tokens[account], body)
    assert (status, answer.get("reason")) == (403, "Forbidden"), answer
    assert f'User "{account_user(account)}" cannot' in answer["message"]


def test_a_grant_deploy_does_not_make_is_caught(
    installed: Cluster, filled: dict[str, dict[str, Any]], tokens: dict[str, str]
) -> None:
    """The comparison above can fail: a RoleBinding made by hand, outside deploy/, that lets
    the agent read the namespace shows up as rights nobody declared, until it is removed."""
    account = "podwire-agent"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pw-deploy-test-extra", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }
    token = tokens[account]
    done = installed.apply(binding, dry_run=False)
    assert done.returncode == 0, done.stderr
    try:
        assert eventually(
            lambda: (
                ("", "pods", "", "list")
                in unexplained(installed, filled, account, token, NAMESPACE)[0]
            )
        )
        can = installed.kubectl(
            "auth", "can-i", "list", "pods", "-n", NAMESPACE, f"--as={account_user(account)}"
        )
        assert can.stdout.strip() == "yes"
    finally:
        installed.ok("delete", "rolebinding", "pw-deploy-test-extra", "-n", NAMESPACE)
    assert eventually(
        lambda: unexplained(installed, filled, account, token, NAMESPACE) == (set(), set())
    )


class Answers(ApiReach):
    """Which informers' lists and watches the apiserver accepted."""

    def __init__(self, server: str) -> None:
        super().__init__(server)
        self.kinds: list[str] = []

    def answered(self, kind: str) -> None:
        self.kinds.append(kind)
        super().answered(kind)


async def test_the_controllers_informers_run_with_its_own_token(
    installed: Cluster, tokens: dict[str, str], tmp_path: Path
) -> None:
    """The controller's real calls, as its leader makes them (``KubeWatcher``: list, then
    watch, Namespaces, Pods and NetworkPolicies in every namespace), with a kubeconfig like
    deploy/'s (a token file and a CA file) holding the controller's own token: each informer
    lists and its watch is accepted; none fails. The same token's other calls are refused
    (above)."""
    token = tmp_path / "token"
    token.write_text(tokens["podwire-controller"])
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": installed.info["kube_apiserver"],
                            "certificate-authority": str(installed.ca_file),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"tokenFile": str(token)}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    api = await KubeApi.from_kubeconfig(kubeconfig)
    reach = Answers(api.server)
    watcher = KubeWatcher(api, reach=reach)
    task = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(30):
            await watcher.synced()
            while len(reach.kinds) < 2 * len(watcher.informers):  # each list, each watch
                await asyncio.sleep(0.05)
        assert sorted(reach.kinds) == sorted(2 * [i.kind for i in watcher.informers])
        assert reach.errors == 0 and reach.problem is None
        assert "kube-system" in {key.name for key in watcher.namespaces.objects}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
