"""kubectl against the stack with ``--kubernetes`` (the session's ``kube_stack`` fixture, in
tests/conftest.py: tests/deploy uses the same one)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def kubectl(
    info: dict[str, Any], *args: str, kubeconfig: str = ""
) -> subprocess.CompletedProcess[str]:
    """kubectl as the admin, or as the identity of another of the stack's kubeconfigs."""
    binary = Path(info["kube_bin_dir"]) / "kubectl"
    config = kubeconfig or info["kubeconfig"]
    argv = [str(binary), "--kubeconfig", config, "--request-timeout=20s", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)
