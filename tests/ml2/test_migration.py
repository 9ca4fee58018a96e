"""The alembic branch a real deployment runs: ``neutron-db-manage --subproject podwire``."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pymysql
import sqlalchemy as sa

from podwire.ml2.journal import JournalRow
from podwire.stack.mariadb import MariaDB


def test_upgrade_head_creates_the_journal_like_the_model(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    mariadb = MariaDB(Path(stack["data_dir"]))
    database = f"pwmig_{uuid.uuid4().hex[:10]}"
    admin = pymysql.connect(unix_socket=str(mariadb.socket), user="root")
    with admin, admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {database}")
    url = mariadb.url.replace("/neutron?", f"/{database}?")
    try:
        conf = tmp_path / "neutron.conf"
        conf.write_text(f"[database]\nconnection = {url}\n")
        manage = Path(sys.executable).parent / "neutron-db-manage"
        result = subprocess.run(
            [str(manage), "--config-file", str(conf), "--subproject", "podwire", "upgrade", "head"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        engine = sa.create_engine(url)
        try:
            inspector = sa.inspect(engine)
            columns = {c["name"]: c for c in inspector.get_columns("podwire_journal")}
            assert set(columns) == {c.name for c in JournalRow.__table__.columns}
            assert columns["value"]["nullable"] and not columns["key"]["nullable"]
            # Large enough for a security group of 1,000 rules (TEXT stops at 64 KiB).
            assert "MEDIUMTEXT" in str(columns["value"]["type"]).upper()
            with engine.connect() as conn:
                version = conn.execute(sa.text("SELECT version_num FROM alembic_version_podwire"))
                assert version.scalar() == "podwire_0002"
        finally:
            engine.dispose()
    finally:
        admin = pymysql.connect(unix_socket=str(mariadb.socket), user="root")
        with admin, admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {database}")
