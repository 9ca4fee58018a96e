"""``podwire etcd grant-node|grant-server``: etcd users with exactly the access they need.

Both print the two lines of the ``[etcd]`` section the new user goes into. A re-run keeps the
password (a running node must not lose etcd access because an operator ran the command
twice): it prints it again when the local stack's data dir keeps it, else says it is
unchanged. ``--rotate`` sets a new one, which the running user must be given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from podwire.config import EtcdSettings, load_settings
from podwire.errors import ConfigError, ValidationError
from podwire.etcd import admin
from podwire.etcd.client import EtcdClient
from podwire.etcd.roles import COMPONENTS, RoleSpec, node_role, server_role
from podwire.keys import check_segment
from podwire.schema.deployment import DEFAULT_NAME, Deployment, deployments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("etcd", help="manage podwire's etcd users and roles")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    node = actions.add_parser("grant-node", help="a user for one node's agent")
    node.add_argument("node", help="the node's name (agent.host)")
    _common(node)
    node.set_defaults(handler=_grant_node)
    server = actions.add_parser("grant-server", help="a user for controllers or the ml2 driver")
    server.add_argument("name", help="the etcd user name")
    server.add_argument(
        "--component",
        choices=COMPONENTS,
        required=True,
        help="what runs as this user: ml2 (inside neutron-server) or controller",
    )
    _common(server)
    server.set_defaults(handler=_grant_server)


def _common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="a local stack started with --etcd-auth")
    where.add_argument("--config", help="podwire TOML file whose [etcd] names the root user")
    parser.add_argument("--rotate", action="store_true", help="set a new password")
    parser.add_argument(
        "--deployment",
        action="append",
        default=[],
        metavar="NAME",
        help="the deployment the user serves (default podwire); ml2 takes it once per"
        " deployment it serves",
    )


def _deployments(args: argparse.Namespace) -> list[Deployment]:
    try:
        return deployments(args.deployment or [DEFAULT_NAME], "--deployment")
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc


def _grant_node(args: argparse.Namespace) -> int:
    deployments = _deployments(args)
    if len(deployments) != 1:
        raise ConfigError("--deployment: a node belongs to exactly one deployment")
    try:
        spec = node_role(args.node, deployments[0])
    except ValueError as exc:
        raise ConfigError(f"NODE: {exc}") from exc
    return _grant(args, spec.name, spec)


def _grant_server(args: argparse.Namespace) -> int:
    try:
        name = check_segment(args.name, "user name")
    except ValueError as exc:
        raise ConfigError(f"NAME: {exc}") from exc
    deployments = _deployments(args)
    try:
        spec = server_role(args.component, deployments)
    except ValueError as exc:
        raise ConfigError(f"--deployment: {exc}") from exc
    return _grant(args, name, spec)


def _grant(args: argparse.Namespace, user: str, spec: RoleSpec) -> int:
    from podwire.stack.etcd_auth import Credentials, SecretStore

    store = SecretStore(args.data_dir.resolve()) if args.data_dir else None
    known = store.load(user) if store else None
    password = admin.new_password() if args.rotate or known is None else known.password
    issued = asyncio.run(_apply(_root_settings(args), user, spec, password, args.rotate))
    if store is not None and issued.password is not None:
        store.save(Credentials(user, issued.password))
    shown = issued.password or (known.password if known else None)
    print(f'user = "{user}"')
    if shown is not None:
        print(f"password = {json.dumps(shown)}")
    else:
        print("# password unchanged (podwire keeps no copy); --rotate sets a new one")
    if args.rotate and not issued.created:
        print(
            f"podwire etcd: the password of {user!r} changed; whatever runs as {user!r} is"
            " refused by etcd until its [etcd] password is updated",
            file=sys.stderr,
        )
    return 0


async def _apply(
    settings: EtcdSettings, user: str, spec: RoleSpec, password: str, rotate: bool
) -> admin.Issued:
    async with await EtcdClient.connect(settings) as client:
        return await admin.ensure_user(client, user, spec, password, rotate)


def _root_settings(args: argparse.Namespace) -> EtcdSettings:
    if args.config:
        settings = load_settings(args.config).etcd
        if not settings.user:
            raise ConfigError("etcd.user: required (a user with the root role)")
        return settings
    from podwire.stack.etcd_auth import root_settings
    from podwire.stack.runner import read_stack_json

    data_dir: Path = args.data_dir.resolve()
    info = read_stack_json(data_dir)
    if not info or not info.get("etcd"):
        raise ConfigError(f"--data-dir: no stack is running on {data_dir}")
    if not info.get("etcd_auth"):
        raise ConfigError(f"--data-dir: the stack on {data_dir} runs without --etcd-auth")
    return root_settings(str(info["etcd"]), data_dir)
