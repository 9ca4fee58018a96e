"""A private MariaDB server for the stack: data and unix socket inside the data dir.

Neutron needs a database that survives concurrent writers (SQLite does not: with 20
concurrent clients most writes fail with "database is locked").
The server listens on no TCP port, so several stacks can run side by side.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pymysql

from podwire.errors import StackError

SOCKET_PATH_MAX = 107
DATABASE = "neutron"


def _binary(name: str) -> str:
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if candidate and Path(candidate).exists():
            return candidate
    raise StackError(f"{name} not found: install the Debian package mariadb-server")


@dataclass(frozen=True)
class MariaDB:
    data_dir: Path

    @property
    def datadir(self) -> Path:
        return self.data_dir / "mysql"

    @property
    def socket(self) -> Path:
        return self.data_dir / "mysql.sock"

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@localhost/{DATABASE}?unix_socket={self.socket}"

    def check_paths(self) -> None:
        if len(str(self.socket)) > SOCKET_PATH_MAX:
            raise StackError(
                f"data dir {self.data_dir} is too long: the MariaDB socket path must stay under"
                f" {SOCKET_PATH_MAX} characters; choose a shorter --data-dir"
            )

    def ensure_initialized(self, log_path: Path) -> None:
        if (self.datadir / "mysql").is_dir():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        argv = [
            _binary("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]
        with log_path.open("ab") as log_file:
            result = subprocess.run(argv, stdout=log_file, stderr=subprocess.STDOUT, check=False)
        if result.returncode != 0:
            shutil.rmtree(self.datadir, ignore_errors=True)
            raise StackError(
                f"mariadb-install-db failed (exit {result.returncode}); see {log_path}"
            )

    def argv(self, log_path: Path) -> list[str]:
        return [
            _binary("mariadbd"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--pid-file={self.data_dir / 'mysql.pid'}",
            f"--log-error={log_path}",
            "--user=root",
            "--skip-networking",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=128M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=500",
            "--character-set-server=utf8mb4",
        ]

    def ready(self) -> bool:
        try:
            pymysql.connect(unix_socket=str(self.socket), user="root", connect_timeout=1).close()
        except pymysql.MySQLError:
            return False
        return True

    def ensure_database(self) -> None:
        try:
            connection = pymysql.connect(unix_socket=str(self.socket), user="root")
            with connection, connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE} CHARACTER SET utf8mb4")
        except pymysql.MySQLError as exc:
            raise StackError(f"cannot create the {DATABASE} database: {exc}") from exc
