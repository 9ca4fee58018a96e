"""deploy/: the manifests are valid Kubernetes objects (offline schemas), every podwire command
line in them parses with podwire's own parser, the files they point podwire at are mounted
from where they are, and the ConfigMap's configs pass ``podwire config check`` as they are
and with the environment the manifests give the services."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from podwire.cli.main import build_parser
from tests.deploy.manifests import DEPLOY, NEEDS, documents

# The oldest Kubernetes the manifests are written for, and the newest schemas at hand.
VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# What the cluster fills in for fieldRefs, for the check with the services' environment.
FIELD_SAMPLES = {"spec.nodeName": "node-1", "status.hostIP": "192.0.2.21"}


DOCUMENTS = documents()


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in DOCUMENTS if doc["kind"] == kind}


def _workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in DOCUMENTS if doc["kind"] in ("DaemonSet", "Deployment")]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _podwire_argvs(container: dict[str, Any]) -> list[list[str]]:
    """Every podwire invocation of a container: its command, or each line of a ``sh -c``."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:1] == ["podwire"]:
        return [argv[1:]]
    if len(argv) == 3 and argv[1] == "-c" and argv[0].endswith("sh"):
        runs = []
        for line in argv[2].splitlines():
            words = shlex.split(line)
            if "podwire" in words:
                runs.append(words[words.index("podwire") + 1 :])
        return runs
    return []


def test_the_manifests_are_the_expected_objects() -> None:
    kinds = sorted(name.split(":")[1] for name, _ in DOCUMENTS)
    assert "DaemonSet/podwire-agent" in kinds
    assert "Deployment/podwire-controller" in kinds
    assert "ConfigMap/podwire-config" in kinds
    assert {"Secret/podwire-controller", "Secret/podwire-nodes"} <= set(kinds)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[n for n, _ in DOCUMENTS])
def test_every_manifest_validates_against_the_kubernetes_schemas(
    name: str, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_every_podwire_command_line_parses_with_podwires_parser() -> None:
    seen = []
    for name, workload in _workloads():
        for container in _containers(workload):
            argvs = _podwire_argvs(container)
            assert argvs, f"{name} {container['name']}: runs no podwire command"
            for argv in argvs:
                try:
                    parsed = build_parser().parse_args(argv)
                except SystemExit as exc:
                    raise AssertionError(f"{name} {container['name']}: {argv}") from exc
                seen.append(_verb(parsed))
    assert sorted(seen) == ["agent", "cni install", "controller"]


def _verb(parsed: argparse.Namespace) -> str:
    sub = getattr(parsed, f"{parsed.command}_command", None)
    return f"{parsed.command} {sub}" if sub else str(parsed.command)


def _mounted_from(workload: dict[str, Any], container: dict[str, Any], path: str) -> Any:
    """The ConfigMap key a file path of the container comes from (a subPath mount)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    for mount in container.get("volumeMounts", []):
        if mount["mountPath"] == path and "subPath" in mount:
            source = volumes[mount["name"]]["configMap"]["name"]
            return source, mount["subPath"]
    raise AssertionError(f"{container['name']}: nothing is mounted at {path}")


def _configs_in_use() -> list[tuple[str, dict[str, Any], dict[str, Any], str]]:
    """(workload name, workload, container, ConfigMap key) of every ``--config FILE``."""
    used = []
    for name, workload in _workloads():
        for container in _containers(workload):
            for argv in _podwire_argvs(container):
                if "--config" in argv:
                    path = argv[argv.index("--config") + 1]
                    config_map, key = _mounted_from(workload, container, path)
                    assert key in _by_kind("ConfigMap")[config_map]["data"], (name, key)
                    used.append((name, workload, container, key))
    return used


def _check(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    path = tmp_path / "podwire.toml"
    path.write_text(text)
    argv = [sys.executable, "-m", "podwire.cli.main", "config", "check", str(path)]
    proc = subprocess.run(
        [*argv, "--with-env"] if env is not None else argv,
        capture_output=True,
        text=True,
        env={**(env or {}), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_configmaps_configs_pass_podwire_config_check(tmp_path: Path) -> None:
    data = _by_kind("ConfigMap")["podwire-config"]["data"]
    tomls = sorted(key for key in data if key.endswith(".toml"))
    assert tomls == ["agent.toml", "controller.toml"]
    assert sorted(key for *_, key in _configs_in_use()) == tomls
    for key in tomls:
        assert _check(data[key], tmp_path) == (0, ""), key


def _env_value(item: dict[str, Any], resolved: dict[str, str]) -> str:
    if "value" in item:
        return re.sub(r"\$\((\w+)\)", lambda m: resolved[m.group(1)], item["value"])
    source = item["valueFrom"]
    if "fieldRef" in source:
        return FIELD_SAMPLES[source["fieldRef"]["fieldPath"]]
    ref = source.get("secretKeyRef") or source["configMapKeyRef"]
    kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
    doc = _by_kind(kind)[ref["name"]]
    values = doc["stringData"] if "stringData" in doc else doc["data"]
    return str(values[ref["key"]])


def _service_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment a container starts podwire with: its env, plus what its script exports
    (the agent's node credentials, with placeholder values)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        env[item["name"]] = _env_value(item, env)
    script = " ".join(container.get("command", [])[2:3])
    for name in re.findall(r"\b(PODWIRE_\w+)=", script):
        env[name] = "placeholder"
    return {name: value for name, value in env.items() if name.startswith("PODWIRE_")}


def test_the_configs_pass_with_the_environment_the_manifests_give(tmp_path: Path) -> None:
    data = _by_kind("ConfigMap")["podwire-config"]["data"]
    for name, _, container, key in _configs_in_use():
        env = _service_env(container)
        assert env, name
        assert _check(data[key], tmp_path, env) == (0, ""), (name, env)


def test_config_check_would_catch_a_broken_configmap(tmp_path: Path) -> None:
    code, out = _check('[pool]\nmin = "many"\n[agnet]\n', tmp_path)
    assert code == 2
    assert "pool.min" in out and "[agnet]" in out


def test_the_containerfile_copies_what_exists_and_builds_the_plugin() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    root = DEPLOY.parent
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (root / source).exists(), source
    build = re.search(r"podwire (cni build --output \S+)", text)
    assert build is not None
    build_parser().parse_args(build.group(1).split())


def test_the_schemas_would_catch_a_misspelt_field() -> None:
    (_, agent), *_ = [(n, d) for n, d in DOCUMENTS if d["kind"] == "DaemonSet"]
    broken = yaml.safe_load(yaml.safe_dump(agent))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_a_component_that_needs_no_api_gets_no_token() -> None:
    """Every ServiceAccount of deploy/ is a component whose needs are written down, and one
    that needs nothing of the API gets no token: neither its ServiceAccount nor its pods mount
    one (the apiserver tests check the RBAC side of the same table)."""
    accounts = _by_kind("ServiceAccount")
    assert sorted(accounts) == sorted(NEEDS)
    workloads = {
        doc["spec"]["template"]["spec"]["serviceAccountName"]: doc for _, doc in _workloads()
    }
    assert sorted(workloads) == sorted(NEEDS)
    for name, needs in NEEDS.items():
        pod = workloads[name]["spec"]["template"]["spec"]
        # No ServiceAccount hands its token to every pod that names it; a pod that calls
        # the API asks for it in its own spec.
        assert accounts[name].get("automountServiceAccountToken") is False, name
        assert pod.get("automountServiceAccountToken") is bool(needs), name


def test_the_controllers_kubeconfig_is_the_mounted_one_with_the_mounted_token() -> None:
    """controller.toml names the kubeconfig the Deployment mounts from the ConfigMap, and that
    kubeconfig names the token and CA the kubelet mounts for the pod's ServiceAccount."""
    data = _by_kind("ConfigMap")["podwire-config"]["data"]
    path = tomllib.loads(data["controller.toml"])["kubernetes"]["kubeconfig"]
    (container,) = _by_kind("Deployment")["podwire-controller"]["spec"]["template"]["spec"][
        "containers"
    ]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[path]["subPath"] == "controller-kubeconfig"
    config = yaml.safe_load(data["controller-kubeconfig"])
    (user,) = config["users"]
    (cluster,) = config["clusters"]
    secrets = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert user["user"] == {"tokenFile": f"{secrets}/token"}
    assert cluster["cluster"]["certificate-authority"] == f"{secrets}/ca.crt"
    assert cluster["cluster"]["server"] == "https://kubernetes.default.svc"
