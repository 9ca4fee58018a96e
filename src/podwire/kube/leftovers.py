"""What a node leaves on the machine, removed when it stops, and what a killed run left,
removed by the next one before it starts.

A kube-node killed outright (SIGKILL) takes kubelet and containerd with it (parent-death
signal), but the pods' shims and sandboxes, the mounts and the link to the apiserver stay.
Its pods' ports must still go back through CNI DEL, so containerd is started once more on its
old state only to remove every sandbox through the CRI, then removed with the rest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from podwire.errors import KubeError
from podwire.kube import mounts, nsfilter, sandboxes
from podwire.kube.apilink import ApiLink
from podwire.kube.containerd import Containerd
from podwire.kube.kubelet import KubeletFiles
from podwire.log import get_logger
from podwire.netlink import is_netns, netns_path
from podwire.stack import procs

log = get_logger(__name__)

LINK_RECORD = "apilink.json"
TABLES_RECORD = "netfilter-before.json"


def remember_link(directory: Path, link: ApiLink) -> None:
    """Written before the link is made: a killed run's link is then found by the next."""
    record = {"netns": link.netns, "node_ip": link.node_ip, "api_ip": link.api_ip}
    (directory / LINK_RECORD).write_text(json.dumps(record) + "\n")


def forget_link(directory: Path, link: ApiLink) -> None:
    link.delete()
    (directory / LINK_RECORD).unlink(missing_ok=True)


def _recorded_link(directory: Path) -> ApiLink | None:
    try:
        record = json.loads((directory / LINK_RECORD).read_text())
        return ApiLink(str(record["netns"]), str(record["node_ip"]), str(record["api_ip"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_tables(directory: Path, netns: str) -> None:
    """The namespace's netfilter tables before kubelet starts: those it adds go with it."""
    before = sorted(nsfilter.tables(netns))
    (directory / TABLES_RECORD).write_text(json.dumps({"netns": netns, "tables": before}) + "\n")


def forget_tables(directory: Path, netns: str) -> None:
    """After kubelet stopped: its chains, and the tables it added."""
    try:
        record = json.loads((directory / TABLES_RECORD).read_text())
        before = {(str(family), str(name)) for family, name in record["tables"]}
    except (OSError, ValueError, KeyError, TypeError):
        return
    if is_netns(netns_path(netns)):
        nsfilter.remove_kubelet_chains(netns, before)
    (directory / TABLES_RECORD).unlink(missing_ok=True)


def _recorded_netns(directory: Path) -> str:
    try:
        return str(json.loads((directory / TABLES_RECORD).read_text())["netns"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def unmount_node(directory: Path, files: KubeletFiles) -> None:
    """kubelet's mounts and the node dir's own bind; then its pods' dirs and logs, once
    nothing is mounted below them any more (never a recursive delete through a mounted
    volume): the node's pods are gone by then."""
    left = mounts.unmount_under(directory, include_self=True)
    if left:
        raise KubeError(f"still mounted under {directory}: {', '.join(left)}")
    for gone in (files.root / "pods", files.pod_logs, files.container_logs):
        shutil.rmtree(gone, ignore_errors=True)


def clean(directory: Path, files: KubeletFiles, containerd: Containerd) -> None:
    """Undo what a killed run of this node left behind; nothing when it stopped cleanly."""
    for marker in (str(files.config), str(containerd.config_file)):
        for pid in procs.pids_marked(marker):
            if procs.terminate(pid, marker, timeout=30):
                log.warning("kube_node.leftover_stopped", pid=pid)
    if containerd.work.exists():
        _release_sandboxes(containerd)
        containerd.cleanup()
    unmount_node(directory, files)
    netns = _recorded_netns(directory)
    if netns:
        forget_tables(directory, netns)
    link = _recorded_link(directory)
    if link is not None:
        forget_link(directory, link)


def _release_sandboxes(containerd: Containerd) -> None:
    """The killed run's pods' CNI DELs, through a containerd started on its old state."""
    try:
        containerd.prepare()
        containerd.start()
    except KubeError as exc:
        log.error("kube_node.leftover_sandboxes_kept", error=str(exc))
        return
    failed = sandboxes.remove_all(containerd.socket)
    for failure in failed:
        log.error("kube_node.leftover_sandbox_kept", sandbox=failure)
