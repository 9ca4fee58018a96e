"""The wheel as an operator installs it: a fresh venv beside Neutron, migrations, the driver.

Everything the local stack does for convenience is left out here: the schema comes from
``neutron-db-manage``, the API runs Neutron's own ``neutron.wsgi.api`` under a WSGI server
configured by file, and the config sits where the packages look for it
(``neutron.conf``, ``plugins/ml2/ml2_conf.ini``, ``api-paste.ini`` in ``OS_NEUTRON_CONFIG_DIR``).
Only what this machine lacks is stood in for: ``noauth`` (no Keystone) and the ``fake:/``
transport (no RabbitMQ). etcd is a private server so that this Neutron's forwarder does not
meet the session stack's in one election.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import pymysql
import pytest
from packaging.specifiers import SpecifierSet

from podwire.config import EtcdSettings
from podwire.etcd.client import EtcdClient
from podwire.neutron.client import neutron_connection
from podwire.stack import procs
from podwire.stack.etcd_server import EtcdServer
from podwire.stack.mariadb import MariaDB
from podwire.stack.netutil import free_port, http_ok, wait_until
from tests.scripted_agent import ScriptedAgent, bound_on, eventually

pytestmark = [pytest.mark.wheel, pytest.mark.stack]

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

NEUTRON_CONF = """\
[DEFAULT]
core_plugin = ml2
service_plugins = trunk
auth_strategy = noauth
transport_url = fake:/
state_path = {state}
log_file = {log}
use_stderr = False

[database]
connection = {db_url}

[oslo_concurrency]
lock_path = {state}/lock

[ml2_podwire]
etcd_endpoints = {etcd_url}
"""

ML2_CONF = """\
[ml2]
type_drivers = flat,vlan,vxlan
tenant_network_types = vxlan
mechanism_drivers = podwire
extension_drivers = port_security

[ml2_type_vxlan]
vni_ranges = 1001:2000
"""

GUNICORN_CONF = """\
wsgi_app = "neutron.wsgi.api:application"
bind = "127.0.0.1:{port}"
workers = 1
timeout = 300
"""


def run(argv: list[Any], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs
    )
    assert result.returncode == 0, f"{argv}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, then the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    # The sdist step writes src/podwire.egg-info, as editable installs do: scripts/setup holds
    # the same lock on src while it installs (.ci/run sets up other venvs meanwhile).
    src = os.open(ROOT / "src", os.O_RDONLY)
    try:
        fcntl.flock(src, fcntl.LOCK_EX)
        run([sys.executable, "-m", "build", "--outdir", out, ROOT])
    finally:
        os.close(src)
    (built,) = out.glob("podwire-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of its own (no system site packages) with the wheel and the pinned versions."""
    path = tmp_path_factory.mktemp("wheel-venv") / "venv"
    run([sys.executable, "-m", "venv", path])
    # Byte-compiling all of Neutron's tree up front is most of the install time; imports
    # compile what they load.
    pip = [path / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    run([*pip, "-c", ROOT / "constraints.txt", wheel])
    return path


def test_the_wheel_carries_sources_migrations_and_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(meta_name).decode())
        (entry_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(entry_name).decode()
    for shipped in (
        "podwire/cni/c/podwire-cni.c",
        "podwire/cni/plugin.py",
        "podwire/ml2/migration/alembic_migrations/versions/podwire_0001_journal.py",
        "podwire/ml2/migration/alembic_migrations/versions/podwire_0002_journal_values.py",
        "podwire/ml2/migration/alembic_migrations/script.py.mako",
        "podwire/deviceplugin/protos/deviceplugin_v1beta1.proto",
        "podwire/kube/pause.c",  # kube-node builds the sandbox image from it
        "podwire/kube/cri/protos/cri_runtime_v1.proto",
        "podwire/py.typed",
    ):
        assert shipped in names
    assert SpecifierSet(meta["Requires-Python"]) == SpecifierSet(PYPROJECT["requires-python"])
    assert set(meta.get_all("Classifier") or []) == set(PYPROJECT["classifiers"])
    assert "podwire = podwire.ml2.driver:PodwireMechanismDriver" in entry_points
    assert "podwire = podwire.ml2.migration:alembic_migrations" in entry_points


def test_the_wheel_installs_with_consistent_requirements(venv: Path) -> None:
    assert "No broken requirements" in run([venv / "bin" / "python", "-m", "pip", "check"]).stdout


@pytest.fixture
def database(stack: dict[str, Any]) -> Iterator[str]:
    """A fresh, empty database in the session's MariaDB, dropped afterwards."""
    mariadb = MariaDB(Path(stack["data_dir"]))
    name = f"pwwheel_{uuid.uuid4().hex[:10]}"
    with pymysql.connect(unix_socket=str(mariadb.socket), user="root") as admin:
        admin.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    yield mariadb.url.replace("/neutron?", f"/{name}?")
    with pymysql.connect(unix_socket=str(mariadb.socket), user="root") as admin:
        admin.cursor().execute(f"DROP DATABASE {name}")


@pytest.fixture
async def private_etcd(tmp_path: Path) -> AsyncIterator[tuple[EtcdClient, str]]:
    server = EtcdServer(tmp_path / "etcd", free_port(), free_port())
    proc = procs.spawn(server.argv(), tmp_path / "etcd.out")
    try:
        wait_until(server.ready, "etcd", 60, alive=lambda: proc.poll() is None)
        client = await EtcdClient.connect(EtcdSettings(endpoints=[server.client_url]))
        try:
            yield client, server.client_url
        finally:
            await client.close()
    finally:
        procs.stop_child(proc)


def _operator_config(etc: Path, db_url: str, etcd_url: str) -> Path:
    """/etc/neutron as an operator lays it out, with api-paste.ini from the installed Neutron."""
    neutron_etc = etc / "neutron"
    (neutron_etc / "plugins" / "ml2").mkdir(parents=True)
    state = etc / "state"
    (state / "lock").mkdir(parents=True)
    (neutron_etc / "neutron.conf").write_text(
        NEUTRON_CONF.format(state=state, log=etc / "neutron.log", db_url=db_url, etcd_url=etcd_url)
    )
    (neutron_etc / "plugins" / "ml2" / "ml2_conf.ini").write_text(ML2_CONF)
    return neutron_etc


def _db_manage(venv: Path, neutron_etc: Path, *args: str) -> None:
    confs = ["--config-file", neutron_etc / "neutron.conf"]
    confs += ["--config-file", neutron_etc / "plugins" / "ml2" / "ml2_conf.ini"]
    run([venv / "bin" / "neutron-db-manage", *confs, *args])


def _podwire_version(db_url: str) -> str:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            table = sa.inspect(conn).get_columns("podwire_journal")
            assert {c["name"] for c in table} >= {"id", "key", "value", "attempts"}
            return str(
                conn.execute(sa.text("SELECT version_num FROM alembic_version_podwire")).scalar()
            )
    finally:
        engine.dispose()


def _serve_neutron(
    venv: Path, work: Path, db_url: str, etcd_url: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Migrate the database and start Neutron's API as an operator would: (server, its URL)."""
    port = free_port()
    neutron_etc = _operator_config(work / "etc", db_url, etcd_url)
    (neutron_etc / "api-paste.ini").write_bytes((venv / "etc/neutron/api-paste.ini").read_bytes())
    _db_manage(venv, neutron_etc, "--subproject", "neutron", "upgrade", "heads")
    _db_manage(venv, neutron_etc, "--subproject", "podwire", "upgrade", "head")
    assert _podwire_version(db_url) == "podwire_0002"
    server_dir = work / "server"
    server_dir.mkdir()
    (server_dir / "gunicorn.conf.py").write_text(GUNICORN_CONF.format(port=port))
    # gunicorn reads ./gunicorn.conf.py, so its argv carries nothing oslo.config would reject.
    server = subprocess.Popen(
        [str(venv / "bin" / "gunicorn")],
        cwd=server_dir,
        env={**os.environ, "OS_NEUTRON_CONFIG_DIR": str(neutron_etc)},
        stdout=(work / "gunicorn.out").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(
            lambda: http_ok(url, 5),
            f"neutron (logs in {work})",
            180,
            alive=lambda: server.poll() is None,
        )
    except BaseException:
        procs.stop_child(server)
        raise
    return server, url


async def test_operator_install_migrates_loads_the_driver_and_binds_a_port(
    venv: Path, database: str, private_etcd: tuple[EtcdClient, str], tmp_path: Path
) -> None:
    etcd, etcd_url = private_etcd
    server, url = await asyncio.to_thread(_serve_neutron, venv, tmp_path, database, etcd_url)
    agent = ScriptedAgent(etcd, f"h-{uuid.uuid4().hex[:8]}")
    try:
        await agent.register(capabilities=(["veth"], ["vxlan"]))
        neutron = neutron_connection(url)
        project = uuid.uuid4().hex
        network = neutron.network.create_network(name="pw-wheel", project_id=project)
        neutron.network.create_subnet(
            network_id=network.id, cidr="10.78.0.0/24", ip_version=4, project_id=project
        )
        bound = await bound_on(neutron, network, project, agent.host)
        assert bound.binding_vif_type == "veth"
        desired = await eventually(lambda: agent.desired(bound.id), "desired key in etcd")
        assert desired["network_id"] == network.id
        assert desired["segmentation_id"] == network.provider_segmentation_id
        await agent.wire(bound.id)

        async def active() -> bool:
            return bool(neutron.network.get_port(bound.id).status == "ACTIVE")

        await eventually(active, "port ACTIVE after the agent reported it wired")
    finally:
        await asyncio.to_thread(procs.stop_child, server, 30)
        await agent.cleanup()


def test_cni_install_from_the_wheel_builds_the_plugin_or_falls_back(
    venv: Path, tmp_path: Path
) -> None:
    podwire = venv / "bin" / "podwire"
    common = ["cni", "install", "--conf-dir", tmp_path / "conf", "--network", "pods"]
    built = run([podwire, *common, "--bin-dir", tmp_path / "c"])
    assert "C, built with" in built.stdout
    assert (tmp_path / "c" / "podwire").read_bytes()[:4] == b"\x7fELF"
    # Without a compiler on PATH (only the venv's bin), the Python plugin is installed instead.
    env = {"PATH": str(venv / "bin")}
    fallback = run([podwire, *common, "--bin-dir", tmp_path / "py"], env=env)
    assert "Python fallback" in fallback.stdout
    assert (tmp_path / "py" / "podwire").read_text().startswith("#!")
    for kind in ("c", "py"):
        version = run([tmp_path / kind / "podwire"], env={**env, "CNI_COMMAND": "VERSION"})
        assert "1.1.0" in json.loads(version.stdout)["supportedVersions"]
