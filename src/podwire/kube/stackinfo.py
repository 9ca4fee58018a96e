"""What a node needs to know of the running stack it joins, read from its ``stack.json``.

Checked before anything is started, so a wrong data dir or a stack without Kubernetes is one
clear line, not a kubelet that retries forever.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.errors import KubeError, ValidationError
from podwire.schema import fields
from podwire.stack import procs
from podwire.stack.kube_pki import Pki
from podwire.stack.runner import read_stack_json


@dataclass(frozen=True)
class StackFacts:
    apiserver: str  # https://ADDRESS:PORT
    bin_dir: Path  # kubelet, kubectl, ...
    pki: Pki  # the stack's CA (DIR/kube/pki)
    cluster_dns: str | None = None  # the kube-dns Service's address, when the stack runs DNS

    @property
    def api_ip(self) -> str:
        return urllib.parse.urlsplit(self.apiserver).hostname or ""

    @property
    def kubelet(self) -> Path:
        return self.bin_dir / "kubelet"


def read(data_dir: Path) -> StackFacts:
    info = read_stack_json(data_dir)
    if info is None:
        raise KubeError(
            f"no stack is running on {data_dir} (no stack.json): start one with"
            f" podwire stack up --kubernetes --data-dir {data_dir}"
        )
    supervisor = info.get("pids", {}).get("supervisor", 0)
    if not procs.is_ours(supervisor, info.get("cmdlines", {}).get("supervisor", "\0")):
        raise KubeError(f"the stack on {data_dir} is not running (its stack.json is stale)")
    apiserver, bin_dir = info.get("kube_apiserver"), info.get("kube_bin_dir")
    if not isinstance(apiserver, str) or not isinstance(bin_dir, str):
        raise KubeError(
            f"the stack on {data_dir} runs without Kubernetes: start it with"
            " podwire stack up --kubernetes"
        )
    facts = StackFacts(
        apiserver, Path(bin_dir), Pki(data_dir / "kube" / "pki"), _cluster_dns(info, data_dir)
    )
    if not facts.kubelet.is_file():
        raise KubeError(
            f"kubelet is not in {facts.bin_dir}: run scripts/setup, which builds the"
            " Kubernetes binaries once per machine"
        )
    return facts


def _cluster_dns(info: dict[str, Any], data_dir: Path) -> str | None:
    """The kube-dns Service's address the stack wrote, if it runs DNS; refused if it is no
    IPv4 address (kubelet would take it and every pod's resolver would be wrong)."""
    value = info.get("cluster_dns")
    if value is None:
        return None
    try:
        return str(fields.host_address(value, f"{data_dir}/stack.json: cluster_dns", version=4))
    except ValidationError as exc:
        raise KubeError(str(exc)) from exc
