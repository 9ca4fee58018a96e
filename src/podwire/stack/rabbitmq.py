"""A private RabbitMQ for ``podwire stack up --rpc``: Neutron's agents talk to the server over it.

Everything is inside ``DIR/rabbitmq`` (node name, cookie, mnesia and log dirs, config) and
every socket is on loopback, so it shares nothing with a system-wide broker or another stack.
The broker and its epmd run as Debian's ``rabbitmq`` user (the package's own files belong to
it). epmd is the stack's own child, started before the broker, which is told not to start one:
an epmd the broker starts itself daemonizes and would outlive the stack.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import kombu
import kombu.exceptions

from podwire.errors import StackError
from podwire.stack.netutil import port_open

USER = "rabbitmq"
NODE_NAME = "podwire@localhost"
SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
# The broker's command line carries the data dir (an Erlang user flag the broker ignores), so
# a stale broker of this stack is recognised by its command line and no other stack's is.
MARKER_FLAG = "-podwire_stack"
CONFIG = """\
listeners.tcp.default = 127.0.0.1:{amqp_port}
log.file = false
log.console = true
log.console.level = warning
"""


def account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError as exc:
        raise StackError(
            "--rpc needs RabbitMQ: install the Debian package rabbitmq-server"
        ) from exc


@dataclass(frozen=True)
class RabbitMQ:
    data_dir: Path
    amqp_port: int
    dist_port: int
    epmd_port: int

    @property
    def home(self) -> Path:
        return self.data_dir / "rabbitmq"

    @property
    def transport_url(self) -> str:
        # guest is admitted only over loopback, which is the only place the broker listens.
        return f"rabbit://guest:guest@127.0.0.1:{self.amqp_port}/"

    def prepare(self) -> None:
        """The broker's dirs, config and Erlang cookie, owned by the rabbitmq user."""
        user = account()
        if not SERVER.exists() or not shutil.which("epmd"):
            raise StackError("--rpc needs RabbitMQ: install the Debian package rabbitmq-server")
        _check_reachable(self.home.parent, user)
        for path in (self.home, self.home / "mnesia", self.home / "log"):
            path.mkdir(mode=0o750, exist_ok=True)
        (self.home / "rabbitmq.conf").write_text(CONFIG.format(amqp_port=self.amqp_port))
        (self.home / "enabled_plugins").write_text("[].\n")
        (self.home / "rabbitmq-env.conf").write_text("")
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(20))
        for root, dirs, files in os.walk(self.home):
            for name in [".", *dirs, *files]:
                os.chown(Path(root, name), user.pw_uid, user.pw_gid, follow_symlinks=False)

    def epmd_argv(self) -> list[str]:
        return [_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"]

    def argv(self) -> list[str]:
        return [str(SERVER), MARKER_FLAG, str(self.data_dir)]

    def environ(self) -> dict[str, str]:
        home = self.home
        return {
            "HOME": str(home),
            "RABBITMQ_NODENAME": NODE_NAME,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
            ),
        }

    def epmd_ready(self) -> bool:
        return port_open(self.epmd_port)

    def ready(self) -> bool:
        return port_open(self.amqp_port)

    def consumed(self, queues: tuple[str, ...]) -> bool:
        """Every queue exists and has a consumer: a server that publishes to a queue before
        its consumer declared it loses the message (an agent's call would time out)."""
        # kombu names the transport "pyamqp" where oslo.messaging says "rabbit".
        url = f"pyamqp://guest:guest@127.0.0.1:{self.amqp_port}//"
        connection = kombu.Connection(url, connect_timeout=2)
        errors = (
            OSError,
            kombu.exceptions.KombuError,
            *connection.connection_errors,
            *connection.channel_errors,
        )
        try:
            with connection:
                channel = connection.channel()
                for queue in queues:
                    _, _, consumers = channel.queue_declare(queue=queue, passive=True)
                    if not consumers:
                        return False
        except errors:
            return False
        return True


def _epmd() -> str:
    found = shutil.which("epmd")
    if not found:
        raise StackError("--rpc needs RabbitMQ: install the Debian package rabbitmq-server")
    return found


def _check_reachable(path: Path, user: pwd.struct_passwd) -> None:
    """The rabbitmq user must be able to walk down to the data dir (a 0700 parent stops it)."""
    for directory in [path, *path.parents]:
        info = directory.stat()
        if info.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif info.st_gid == user.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            raise StackError(
                f"--rpc: the {USER} user cannot reach {path}: {directory} is not searchable"
                f" by it (chmod o+x {directory}, or choose another --data-dir)"
            )
