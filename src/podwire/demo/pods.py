"""Pods as a runtime makes them: a namespace, then the CNI plugin binary with env and stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.errors import StackError

PLUGIN = Path(sys.executable).parent / "podwire-cni"


@dataclass
class Pod:
    name: str
    netns: str
    host: str
    container_id: str
    ip: str = ""
    port_id: str = ""


def cni_conf(network_id: str, project_id: str, sg: str, socket_path: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0",
        "name": "podwire-demo",
        "type": "podwire",
        "network": network_id,
        "project": project_id,
        "securityGroups": [sg],
        "agentSocket": socket_path,
    }


def cni(command: str, pod: Pod, conf: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Run the plugin; returns (milliseconds, parsed stdout) or raises with its error.

    No ``K8S_POD_*`` arguments: these pods are no Kubernetes pods, and the controller's
    Kubernetes side would look them up in the API (their namespace's network, their
    policies) and release the ports of pods it does not find."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod.container_id,
        "CNI_NETNS": f"/var/run/netns/{pod.netns}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }
    started = time.perf_counter()
    result = subprocess.run(
        [str(PLUGIN)], input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120
    )
    elapsed = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        raise StackError(f"CNI {command} of {pod.name} failed: {result.stdout.strip()}")
    return elapsed, json.loads(result.stdout) if result.stdout.strip() else {}


def new_pod(name: str, netns: str, host: str) -> Pod:
    return Pod(name, netns, host, uuid.uuid4().hex)
