"""A CNI invocation as the agent receives it: environment + network config, validated.

Everything here comes from outside (the runtime, through the plugin binary), so each value is
checked before it can name an interface, a path or a Neutron object, and a bad one becomes
the spec's error code with a message that says which variable or key to fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from podwire.cni.spec import (
    COMMANDS,
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    INVALID_ENV,
    SUPPORTED_VERSIONS,
    CniError,
)

MAX_CONFIG = 1 << 20  # bytes of UTF-8 on stdin for ADD
# More for the other commands: a runtime adds prevResult to the ADD config for DEL and CHECK
# (a DEL must never be refused for a config its ADD was accepted with), GC lists attachments.
MAX_CONFIG_EXTRA = 256 << 10
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")
_K8S_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")
_ARG_KEY = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class NetConf:
    cni_version: str
    name: str
    network: str
    project: str | None
    security_groups: tuple[str, ...]
    prev_result: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class CniRequest:
    command: str
    container_id: str
    ifname: str
    netns: str
    args: dict[str, str]
    conf: NetConf

    @property
    def attachment(self) -> str:
        return attachment_id(self.container_id, self.ifname)

    @property
    def pod(self) -> PodRef | None:
        ns, name = self.args.get("K8S_POD_NAMESPACE"), self.args.get("K8S_POD_NAME")
        if not ns or not name:
            return None
        return PodRef(ns, name, self.args.get("K8S_POD_UID", ""))


def attachment_id(container_id: str, ifname: str) -> str:
    """The pod attachment id the VIF API and the checkpoint use: ``<container>.<ifname>``."""
    return f"{container_id}.{ifname}"


def parse_command(env: dict[str, str]) -> str:
    command = env.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise CniError(
            INVALID_ENV,
            f"CNI_COMMAND {command!r} is not one of {', '.join(COMMANDS)}",
        )
    return command


def parse_request(env: dict[str, str], stdin: str) -> CniRequest:
    command = parse_command(env)
    conf = parse_conf(stdin, command)
    needs_netns = command in ("ADD", "CHECK")
    needs_container = command in ("ADD", "DEL", "CHECK")
    return CniRequest(
        command=command,
        container_id=_container_id(env) if needs_container else "",
        ifname=check_ifname(env.get("CNI_IFNAME", "")) if needs_container else "",
        netns=_netns(env, True) if needs_netns else "",  # DEL: may be missing, stale or gone
        args=parse_args(env.get("CNI_ARGS", "")),
        conf=conf,
    )


def _container_id(env: dict[str, str]) -> str:
    value = env.get("CNI_CONTAINERID", "")
    if not _CONTAINER_ID.match(value):
        raise CniError(
            INVALID_ENV,
            f"CNI_CONTAINERID {value!r} is missing or invalid: it must start with a letter or"
            " digit and contain only letters, digits, '_', '.' or '-'",
        )
    return value


def check_ifname(value: str) -> str:
    bad = (
        not value or len(value) > 15 or value in (".", "..") or any(c in value for c in "/: \t\n\0")
    )
    if bad:
        raise CniError(
            INVALID_ENV,
            f"CNI_IFNAME {value!r} is not a valid interface name: 1 to 15 characters, no '/',"
            " ':' or whitespace, not '.' or '..'",
        )
    return value


def _netns(env: dict[str, str], required: bool) -> str:
    value = env.get("CNI_NETNS", "")
    if not value:
        if required:
            raise CniError(INVALID_ENV, "CNI_NETNS is missing: the pod's network namespace path")
        return ""
    if not value.startswith("/") or len(value) > 4096 or "\0" in value:
        raise CniError(INVALID_ENV, f"CNI_NETNS {value!r} must be an absolute path")
    return value


def parse_args(raw: str) -> dict[str, str]:
    """``K=V;K2=V2``; junk is refused, unknown keys kept (they are informational)."""
    args: dict[str, str] = {}
    if len(raw) > 4096:
        raise CniError(INVALID_ENV, "CNI_ARGS is longer than 4096 characters")
    for item in filter(None, raw.split(";")):
        key, sep, value = item.partition("=")
        if not sep or not _ARG_KEY.match(key):
            raise CniError(
                INVALID_ENV, f"CNI_ARGS: {item!r} is not KEY=VALUE (pairs separated by ';')"
            )
        args[key] = value
    for key in ("K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID"):
        if key in args and not _K8S_VALUE.match(args[key]):
            raise CniError(INVALID_ENV, f"CNI_ARGS: {key}={args[key]!r} is not a valid name")
    return args


def config_limit(command: str) -> int:
    return MAX_CONFIG if command == "ADD" else MAX_CONFIG + MAX_CONFIG_EXTRA


def check_config_size(stdin: str, command: str) -> None:
    """The plugins' limit, in bytes as the runtime wrote them (not characters)."""
    limit = config_limit(command)
    if len(stdin) > limit or len(stdin.encode("utf-8", "surrogatepass")) > limit:
        raise CniError(
            DECODE_FAILURE, f"network config on stdin is too large: more than {limit} bytes"
        )


def parse_conf(stdin: str, command: str) -> NetConf:
    check_config_size(stdin, command)
    try:
        raw = json.loads(stdin) if stdin.strip() else {}
    except ValueError as exc:
        raise CniError(DECODE_FAILURE, f"network config on stdin is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CniError(DECODE_FAILURE, "network config on stdin must be a JSON object")
    version = raw.get("cniVersion", "")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"cniVersion {version!r} is not supported; use one of {', '.join(SUPPORTED_VERSIONS)}",
        )
    if command in ("GC", "STATUS") and version != "1.1.0":
        raise CniError(INCOMPATIBLE_VERSION, f"{command} needs cniVersion 1.1.0, got {version}")
    return NetConf(
        cni_version=version,
        name=_conf_str(raw, "name", required=True),
        network=_conf_str(raw, "network", required=command in ("ADD", "CHECK")),
        project=_conf_str(raw, "project", required=False) or None,
        security_groups=_security_groups(raw.get("securityGroups", [])),
        prev_result=_prev_result(raw.get("prevResult")),
        raw=raw,
    )


def _conf_str(raw: dict[str, Any], key: str, required: bool) -> str:
    value = raw.get(key, "")
    if value == "" and not required:
        return ""
    if not isinstance(value, str) or not _ID.match(value):
        raise CniError(
            INVALID_CONFIG,
            f"network config key {key!r} is missing or invalid ({value!r}): a name or id of"
            " letters, digits, '_', '.' or '-'",
        )
    return value


def _security_groups(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _ID.match(v) for v in value):
        raise CniError(INVALID_CONFIG, "network config key 'securityGroups' must be a list of ids")
    if len(value) > 64:
        raise CniError(INVALID_CONFIG, "network config key 'securityGroups' has more than 64 ids")
    return tuple(value)


def _prev_result(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CniError(INVALID_CONFIG, "network config key 'prevResult' must be an object")
    return value


def check_network_name(value: str, what: str) -> str:
    """For install-time options that end up as config values: same rule as the config."""
    if not _ID.match(value):
        from podwire.errors import ConfigError

        raise ConfigError(f"{what}: {value!r} must be letters, digits, '_', '.' or '-'")
    return value


def valid_attachments(conf: NetConf) -> set[tuple[str, str]]:
    """GC's ``cni.dev/valid-attachments``: the (container id, ifname) pairs to keep."""
    items = conf.raw.get("cni.dev/valid-attachments", [])
    if not isinstance(items, list):
        raise CniError(INVALID_CONFIG, "'cni.dev/valid-attachments' must be a list")
    keep = set()
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str):
            raise CniError(INVALID_CONFIG, "'cni.dev/valid-attachments' entries need containerID")
        keep.add((item["containerID"], str(item.get("ifname", ""))))
    return keep
