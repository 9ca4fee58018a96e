"""The sandbox image of the containerd tests, built offline: no registry is reachable here.

A static ``pause`` (``pause.c``, compiled with gcc) is the image's only file; it is packed as
a docker archive (``manifest.json`` + config + one layer) with the stdlib, which
``ctr images import`` reads and unpacks into the CRI's namespace.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

PAUSE_SOURCE = Path(__file__).resolve().parent / "pause.c"
IMAGE = "podwire.test/pause:1"


def build_pause(out: Path) -> Path:
    """``pause`` compiled statically (libc6-dev provides the static libc)."""
    subprocess.run(
        ["gcc", "-static", "-Os", "-s", "-o", str(out), str(PAUSE_SOURCE)],
        check=True,
        capture_output=True,
    )
    return out


def _layer(binary: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tar.gettarinfo(str(binary), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        info.mode = 0o755
        with binary.open("rb") as fh:
            tar.addfile(info, fh)
    return buf.getvalue()


def _config(layer: bytes) -> bytes:
    body = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
        "history": [{"created_by": "podwire tests: static pause"}],
    }
    return json.dumps(body, sort_keys=True).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_archive(work: Path, name: str = IMAGE) -> Path:
    """A docker archive of the pause image, tagged ``name``."""
    layer = _layer(build_pause(work / "pause"))
    config = _config(layer)
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    layer_name = f"{hashlib.sha256(layer).hexdigest()}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    archive = work / "pause-image.tar"
    with tarfile.open(archive, "w") as tar:
        _add(tar, config_name, config)
        _add(tar, layer_name, layer)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return archive
