"""``[kubernetes]``: off without a kubeconfig; with one, a file the controller cannot read or
use stops it at start with one line naming the file (exit 2), before it campaigns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podwire.config import KubernetesSettings, build_section
from podwire.errors import ConfigError

PODWIRE = Path(sys.executable).parent / "podwire"


def test_off_without_a_kubeconfig_and_a_project_required_with_one() -> None:
    assert build_section(KubernetesSettings, {}, "kubernetes").kubeconfig_path() is None
    with pytest.raises(ConfigError, match=r"kubernetes.project_id: required"):
        build_section(KubernetesSettings, {"kubeconfig": "/k"}, "kubernetes")
    with pytest.raises(ConfigError, match=r"kubernetes.project_id: set kubernetes.kubeconfig"):
        build_section(KubernetesSettings, {"project_id": "p"}, "kubernetes")
    with pytest.raises(ConfigError, match=r"kubernetes.project_id"):
        build_section(KubernetesSettings, {"kubeconfig": "/k", "project_id": "a/b"}, "kubernetes")


def controller(tmp_path: Path, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "controller.toml"
    config.write_text(
        f"""
[etcd]
endpoints = ["http://127.0.0.1:1"]
[neutron]
endpoint = "http://127.0.0.1:1"
[controller]
listen = "127.0.0.1:1"
admin_token = "a"
node_tokens = {{ n1 = "t" }}
[kubernetes]
kubeconfig = "{kubeconfig}"
project_id = "pods"
"""
    )
    command = [str(PODWIRE), "controller", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p / "missing.kubeconfig", "does not exist"),
        (lambda p: p, "is not readable: Is a directory"),
        (lambda p: _write(p / "junk.kubeconfig", "- [not, a, kubeconfig"), "kubeconfig"),
        (lambda p: _write(p / "empty.kubeconfig", "{}"), "kubeconfig"),
        (lambda p: _write(p / "list.kubeconfig", "- a\n- b\n"), "kubeconfig"),
    ],
    ids=["missing", "directory", "not-yaml", "empty", "a-list"],
)
def test_a_kubeconfig_it_cannot_use_stops_the_controller_naming_the_file(
    tmp_path: Path, make: object, says: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    done = controller(tmp_path, path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("podwire controller: error: ") and str(path) in line and says in line
    assert "Traceback" not in done.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
