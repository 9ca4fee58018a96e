"""The images a local Kubernetes node needs, built offline: no registry is reachable here.

Each is packed as a docker archive (``manifest.json`` + config + one layer) with the stdlib,
which ``ctr images import`` reads and unpacks into the CRI's namespace. The sandbox image is a
static ``pause`` (``pause.c``, compiled with gcc -static); the toolbox is Debian's static
busybox (package busybox-static) with the applets a network test uses, for pods that must
ping, fetch or resolve something.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from podwire.errors import KubeError

PAUSE_SOURCE = Path(__file__).resolve().parent / "pause.c"
PAUSE_IMAGE = "localhost/podwire-pause:1"
TOOLBOX_IMAGE = "localhost/podwire-toolbox:latest"
BUSYBOX = Path("/bin/busybox")
TOOLBOX_APPLETS = (
    "sh", "ping", "nc", "wget", "nslookup", "sleep", "ip", "ifconfig", "cat", "ls", "echo",
    "hostname", "ps", "kill", "grep", "env", "true", "false", "date", "timeout", "sed",
    "nproc", "dirname",
)  # fmt: skip


@dataclass(frozen=True)
class LayerFile:
    """One file of a layer: a regular file copied from ``source``, a directory (no source,
    no ``link``) or a symbolic link to ``link``."""

    name: str
    mode: int
    source: Path | None = None
    link: str = ""


def build_pause(out: Path) -> Path:
    """``pause`` compiled statically (libc6-dev provides the static libc)."""
    try:
        subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(out), str(PAUSE_SOURCE)],
            check=True,
            capture_output=True,
            text=True,
        )
    except FileNotFoundError as exc:
        raise KubeError("gcc not found: run scripts/setup (it installs gcc and libc6-dev)") from exc
    except subprocess.CalledProcessError as exc:
        raise KubeError(f"gcc -static pause.c failed: {exc.stderr.strip()}") from exc
    return out


def _info(entry: LayerFile) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0  # the same input packs to the same digest
    info.mode = entry.mode
    if entry.link:
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link
    elif entry.source is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = entry.source.stat().st_size
    return info


def layer(entries: list[LayerFile]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            if entry.source is None or entry.link:
                tar.addfile(_info(entry))
                continue
            with entry.source.open("rb") as fh:
                tar.addfile(_info(entry), fh)
    return buf.getvalue()


def config_blob(blob: bytes, config: Mapping[str, object], created_by: str) -> bytes:
    body = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(blob).hexdigest()}"]},
        "history": [{"created_by": created_by}],
    }
    return json.dumps(body, sort_keys=True).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def pack(archive: Path, tag: str, blob: bytes, config: bytes) -> Path:
    """A docker archive of one layer ``blob`` and its ``config``, tagged ``tag``."""
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    layer_name = f"{hashlib.sha256(blob).hexdigest()}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    with tarfile.open(archive, "w") as tar:
        _add(tar, config_name, config)
        _add(tar, layer_name, blob)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return archive


def build_pause_archive(work: Path, tag: str = PAUSE_IMAGE) -> Path:
    """The sandbox image: ``/pause`` only."""
    blob = layer([LayerFile("pause", 0o755, build_pause(work / "pause"))])
    config = config_blob(
        blob, {"Entrypoint": ["/pause"], "WorkingDir": "/"}, "podwire: static pause"
    )
    return pack(work / "pause-image.tar", tag, blob, config)


def toolbox_entries(busybox: Path = BUSYBOX) -> list[LayerFile]:
    """``/bin/busybox``, its applets as links to it, and the directories a container expects
    (runc makes the mount points it needs, /etc/hosts and /etc/resolv.conf included)."""
    if not busybox.is_file():
        raise KubeError(
            f"{busybox} not found: the toolbox image needs Debian's busybox-static"
            " (run scripts/setup)"
        )
    dirs = [LayerFile(name, 0o755) for name in ("bin", "etc", "root")]
    links = [LayerFile(f"bin/{applet}", 0o777, link="busybox") for applet in TOOLBOX_APPLETS]
    return [*dirs, LayerFile("tmp", 0o1777), LayerFile("bin/busybox", 0o755, busybox), *links]


def build_toolbox_archive(work: Path, tag: str = TOOLBOX_IMAGE) -> Path:
    """The toolbox image: a shell and network tools; its default command sleeps."""
    blob = layer(toolbox_entries())
    settings = {"Cmd": ["sleep", "86400"], "Env": ["PATH=/bin"], "WorkingDir": "/"}
    config = config_blob(blob, settings, "podwire: Debian's static busybox")
    return pack(work / "toolbox-image.tar", tag, blob, config)
