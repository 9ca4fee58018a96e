"""Installing the plugin and a network config where a container runtime looks for them.

The binary is copied under the plugin type name ``podwire`` (runtimes look the ``type`` up in
their bin dir): the one given, else the one the set-up script built next to the interpreter,
else one built here from the C source the package ships (a wheel install has no set-up step).
The conflist is written atomically so a runtime that watches the conf dir never reads half a
file.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire.cni.build import Plugin, build, prebuilt
from podwire.cni.spec import SUPPORTED_VERSIONS
from podwire.config import AGENT_SOCKET
from podwire.errors import ConfigError, ValidationError
from podwire.schema import fields

PLUGIN_NAME = "podwire"
# What every runtime in use reads: containerd 1.6 (Debian 12's) cannot parse a 1.1.0 result
# ("unsupported CNI result version"), so 1.1.0 (STATUS, GC) is opt-in with --cni-version.
DEFAULT_CNI_VERSION = "1.0.0"


@dataclass(frozen=True)
class InstallSpec:
    bin_dir: Path
    conf_dir: Path
    network: str
    name: str = "podwire"
    project: str = ""
    security_groups: list[str] = field(default_factory=list)
    agent_socket: str = AGENT_SOCKET
    chain: list[str] = field(default_factory=list)
    binary: Path | None = None
    cni_version: str = DEFAULT_CNI_VERSION


def conflist(spec: InstallSpec) -> dict[str, Any]:
    plugin: dict[str, Any] = {
        "type": PLUGIN_NAME,
        "network": spec.network,
        "agentSocket": spec.agent_socket,
    }
    if spec.project:
        plugin["project"] = spec.project
    if spec.security_groups:
        plugin["securityGroups"] = list(spec.security_groups)
    plugins = [plugin]
    for extra in spec.chain:
        entry: dict[str, Any] = {"type": extra}
        if extra == "portmap":
            entry["capabilities"] = {"portMappings": True}
        plugins.append(entry)
    return {"cniVersion": spec.cni_version, "name": spec.name, "plugins": plugins}


def install(spec: InstallSpec) -> tuple[Plugin, Path]:
    for value, what in ((spec.network, "--network"), (spec.name, "--name")):
        check_network_name(value, what)
    if spec.cni_version not in SUPPORTED_VERSIONS:
        raise ConfigError(
            f"--cni-version: {spec.cni_version!r} is not one of {', '.join(SUPPORTED_VERSIONS)}"
        )
    if spec.binary is not None and not spec.binary.is_file():
        raise ConfigError(f"--binary: {spec.binary} does not exist")
    spec.bin_dir.mkdir(parents=True, exist_ok=True)
    spec.conf_dir.mkdir(parents=True, exist_ok=True)
    plugin = _install_binary(spec.binary or prebuilt(), spec.bin_dir / PLUGIN_NAME)
    conf = spec.conf_dir / f"10-{spec.name}.conflist"
    tmp_conf = conf.with_name(f".{conf.name}.tmp")
    tmp_conf.write_text(json.dumps(conflist(spec), indent=2) + "\n")
    os.replace(tmp_conf, conf)
    return plugin, conf


def _install_binary(source: Path | None, target: Path) -> Plugin:
    if source is None:
        return build(target)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return Plugin(target, f"copied from {source}")


def check_network_name(value: str, what: str) -> str:
    """For install-time options that end up as config values: same rule as the config."""
    try:
        return fields.neutron_ref(value, what)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc
