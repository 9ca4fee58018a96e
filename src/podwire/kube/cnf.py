"""The memif CNF's image: DPDK's testpmd (its pod: ``manifests.testpmd_pod``).

No registry is reachable here, so the image is packed from the machine's own ``dpdk-testpmd``
(Debian's dpdk-dev): the binary, the shared libraries the loader resolves for it (``ldd``),
the memif PMD and its libraries, on the toolbox's busybox. The pod reads the memif's MAC
from ``memif.json``, which the agent writes into the granted dir at the pod's CNI ADD (before
any container starts), and runs testpmd as the memif client in icmpecho mode: it answers ARP
and ping on the pod's Neutron address, as a CNF answers on its port.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from podwire.errors import KubeError
from podwire.kube.images import LayerFile, config_blob, layer, pack, toolbox_entries

TESTPMD_IMAGE = "localhost/podwire-testpmd:latest"
PLUGIN_DIRS = "usr/lib/*/dpdk/pmds-*"  # EAL loads the ``.so`` names found there
PLUGINS = ("librte_net_memif.so", "librte_mempool_ring.so")  # the memif PMD, its mbuf pools
# glibc dlopens libgcc_s for pthread_cancel (testpmd's exit): ldd does not list it.
DLOPENED = ("libgcc_s.so.1",)

# The container's command: the MAC from the grant's memif.json, then testpmd on the last CPU
# (testpmd busy-polls one lcore). stdin stays open (the pod asks for it): testpmd without
# --interactive exits at EOF on stdin.
SCRIPT = """set -e
info="$(dirname "$MEMIF_SOCKET")/memif.json"
mac=$(sed -n 's/.*"mac": *"\\([0-9a-f:]*\\)".*/\\1/p' "$info")
[ -n "$mac" ] || { echo "no mac in $info" >&2; exit 1; }
cpu=$(( $(nproc) - 1 ))
vdev="net_memif0,role=client,socket=$MEMIF_SOCKET,socket-abstract=no"
exec dpdk-testpmd --lcores=0@$cpu,1@$cpu --no-huge -m 256 --no-pci \\
  --no-telemetry --vdev="$vdev,secret=$MEMIF_SECRET,mac=$mac" \\
  -- --no-mlockall --total-num-mbufs=4096 --forward-mode=icmpecho -a
"""


def available() -> bool:
    """Whether this machine can pack the CNF image (the nodes import it when it can)."""
    return testpmd_binary() is not None and bool(plugins())


def testpmd_binary() -> Path | None:
    found = shutil.which("dpdk-testpmd")
    return Path(found) if found else None


def plugins() -> list[Path]:
    """The plugins testpmd needs, in EAL's plugin dir (empty if one is missing)."""
    dirs = sorted(Path("/").glob(PLUGIN_DIRS))
    found = [dirs[-1] / name for name in PLUGINS] if dirs else []
    return found if found and all(path.exists() for path in found) else []


def dlopened(near: Path) -> dict[str, Path]:
    """Libraries loaded at run time, from the directory of a library ldd did list."""
    return {str(near.parent / name): (near.parent / name).resolve() for name in DLOPENED}


def shared_libraries(binary: Path) -> dict[str, Path]:
    """The path the loader takes each library from (the interpreter's included) -> the file."""
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise KubeError(f"ldd {binary} failed: {exc}") from exc
    found: dict[str, Path] = {}
    for line in out.stdout.splitlines():
        words = line.split()
        if "not" in words and "found" in words:
            raise KubeError(f"the CNF image: {binary} needs {words[0]}, which is not installed")
        path = words[2] if len(words) > 3 and words[1] == "=>" else words[0]
        if path.startswith("/"):
            found[path] = Path(path).resolve()
    return found


def testpmd_entries(binary: Path, pmds: list[Path]) -> list[LayerFile]:
    """The toolbox, testpmd, its plugins, and every library they load, at the paths the
    host's loader found them (their directories made first)."""
    files = {str(binary): binary.resolve()} | {str(pmd): pmd.resolve() for pmd in pmds}
    for loaded in (binary, *pmds):
        files |= shared_libraries(loaded)
    libc = next(path for path in files if Path(path).name.startswith("libc.so"))
    files |= dlopened(Path(libc))
    toolbox = [*toolbox_entries(), LayerFile("var", 0o755), LayerFile("var/run", 0o755)]
    known = {entry.name for entry in toolbox}
    dirs: list[LayerFile] = []
    for name in sorted(files):
        for parent in reversed(Path(name.lstrip("/")).parents[:-1]):
            if str(parent) not in known:
                known.add(str(parent))
                dirs.append(LayerFile(str(parent), 0o755))
    regular = [LayerFile(path.lstrip("/"), 0o755, source) for path, source in sorted(files.items())]
    return [*toolbox, *dirs, *regular]


def build_testpmd_archive(work: Path, tag: str = TESTPMD_IMAGE) -> Path:
    binary, pmds = testpmd_binary(), plugins()
    if binary is None or not pmds:
        raise KubeError("the CNF image needs dpdk-testpmd and DPDK's memif PMD (Debian dpdk-dev)")
    blob = layer(testpmd_entries(binary, pmds))
    settings = {
        "Cmd": ["sh", "-c", SCRIPT],
        "Env": ["PATH=/bin:/usr/bin", "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu"],
        "WorkingDir": "/",
    }
    config = config_blob(blob, settings, "podwire: DPDK testpmd from the host's dpdk-dev")
    return pack(work / "testpmd-image.tar", tag, blob, config)
