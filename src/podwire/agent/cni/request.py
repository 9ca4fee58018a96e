"""A CNI invocation as the agent receives it: environment + network config, validated.

Everything here comes from outside (the runtime, through the plugin binary), so each value is
checked before it can name an interface, a path or a Neutron object, and a bad one becomes
the spec's error code with a message that says which variable or key to fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
from podwire.errors import ValidationError
from podwire.schema import doc, fields
from podwire.schema.vif import PodRef, security_groups

MAX_CONFIG = 1 << 20  # bytes of UTF-8 on stdin for ADD
# More for the other commands: a runtime adds prevResult to the ADD config for DEL and CHECK
# (a DEL must never be refused for a config its ADD was accepted with), GC lists attachments.
MAX_CONFIG_EXTRA = 256 << 10
_ARG_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")


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
        """The pod attachment id the VIF API and the checkpoint use: ``<container>:<ifname>``."""
        return fields.attachment_id(self.container_id, self.ifname)

    @property
    def pod(self) -> PodRef | None:
        ns, name = self.args.get("K8S_POD_NAMESPACE"), self.args.get("K8S_POD_NAME")
        if not ns or not name:
            return None
        return PodRef(ns, name, self.args.get("K8S_POD_UID", ""))


def parse_command(env: dict[str, str]) -> str:
    command = env.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        raise CniError(
            INVALID_ENV,
            f"CNI_COMMAND {command!r} is not one of {', '.join(COMMANDS)}",
        )
    return command


class NoSuchAttachment(CniError):
    """A DEL for a container id or ifname ADD refuses: podwire cannot have created anything
    under it, so there is nothing to delete and the DEL succeeds (a failing DEL would make the
    runtime retry the teardown forever)."""


def parse_request(env: dict[str, str], stdin: str) -> CniRequest:
    command = parse_command(env)
    conf = parse_conf(stdin, command)
    container_id, ifname = "", ""
    if command in ("ADD", "DEL", "CHECK"):
        try:
            container_id = _container_id(env)
            ifname = check_ifname(env.get("CNI_IFNAME", ""))
        except CniError as exc:
            if command == "DEL":
                raise NoSuchAttachment(exc.code, exc.msg) from exc
            raise
    return CniRequest(
        command=command,
        container_id=container_id,
        ifname=ifname,
        # DEL: the netns may be missing, stale or gone; DEL needs nothing from the pod either.
        netns=_netns(env, True) if command in ("ADD", "CHECK") else "",
        args=parse_args(env.get("CNI_ARGS", "")) if command != "DEL" else {},
        conf=conf,
    )


def _checked(code: int, check: Callable[[Any, str], str], value: Any, what: str) -> str:
    """A field rule from the schema, its failure as the CNI error ``code``."""
    try:
        return check(value, what)
    except ValidationError as exc:
        raise CniError(code, str(exc)) from exc


def _container_id(env: dict[str, str]) -> str:
    return _checked(
        INVALID_ENV, fields.container_id, env.get("CNI_CONTAINERID", ""), "CNI_CONTAINERID"
    )


def check_ifname(value: str) -> str:
    return _checked(INVALID_ENV, fields.ifname, value, "CNI_IFNAME")


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
        if not sep or not _ARG_KEY.fullmatch(key):
            raise CniError(
                INVALID_ENV, f"CNI_ARGS: {item!r} is not KEY=VALUE (pairs separated by ';')"
            )
        args[key] = value
    for key, check in _POD_ARGS.items():
        if key in args:
            _checked(INVALID_ENV, check, args[key], f"CNI_ARGS {key}")
    return args


_POD_ARGS = {
    "K8S_POD_NAMESPACE": fields.k8s_name,
    "K8S_POD_NAME": fields.k8s_name,
    "K8S_POD_UID": fields.k8s_uid,
}


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
        raw = (
            doc.decode_object(stdin, "network config on stdin", config_limit(command))
            if stdin.strip()
            else {}
        )
    except ValidationError as exc:
        raise CniError(DECODE_FAILURE, str(exc)) from exc
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
    return _checked(INVALID_CONFIG, fields.neutron_ref, value, f"network config key {key!r}")


def _security_groups(value: Any) -> tuple[str, ...]:
    try:
        return security_groups(value, "network config key 'securityGroups'")
    except ValidationError as exc:
        raise CniError(INVALID_CONFIG, str(exc)) from exc


def _prev_result(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CniError(INVALID_CONFIG, "network config key 'prevResult' must be an object")
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
