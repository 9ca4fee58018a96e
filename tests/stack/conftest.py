"""A stack with ``--kubernetes``, in a data dir of its own: the session's stack stays as fast
as it was for the tests that need no Kubernetes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podwire.stack import kube_control
from tests.conftest import start_stack, stop_stack


@pytest.fixture(scope="session")
def kube_stack(work_dir: Path) -> Iterator[dict[str, Any]]:
    """kube-apiserver, kube-controller-manager and kube-scheduler with etcd, MariaDB and
    Neutron; fails at once, naming scripts/setup, if the binaries were never built."""
    kube_control.check_binaries(kube_control.default_bin_dir())
    proc, info = start_stack(work_dir / "kube-stack", extra=("--kubernetes",))
    yield info
    stop_stack(proc)


def kubectl(
    info: dict[str, Any], *args: str, kubeconfig: str = ""
) -> subprocess.CompletedProcess[str]:
    """kubectl as the admin, or as the identity of another of the stack's kubeconfigs."""
    binary = Path(info["kube_bin_dir"]) / "kubectl"
    config = kubeconfig or info["kubeconfig"]
    argv = [str(binary), "--kubeconfig", config, "--request-timeout=20s", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)
