from __future__ import annotations

from pathlib import Path

import pytest

from podwire.config import Settings, load_settings
from podwire.errors import ConfigError, ValidationError
from podwire.schema.deployment import deployments


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "podwire.toml"
    path.write_text(text)
    return path


def test_defaults_match_the_seed() -> None:
    settings = load_settings(env={})
    assert settings == Settings()
    pool = settings.pool
    assert (pool.min, pool.max, pool.batch, pool.update_interval) == (5, 0, 10, 20.0)
    assert (pool.bulk_concurrency, pool.populate_timeout, pool.node_cleanup_interval) == (
        20,
        420.0,
        600.0,
    )


def test_file_values_are_typed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[etcd]
endpoints = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
[agent]
host = "node-1"
physnet_mappings = { physnet1 = "eth1" }
heartbeat_ttl = 10
[pool]
update_interval = 5
""",
    )
    settings = load_settings(path, env={})
    assert settings.etcd.endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert settings.agent.physnet_mappings == {"physnet1": "eth1"}
    assert settings.pool.update_interval == 5.0


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nhost = "a"\n')
    env = {
        "PODWIRE_AGENT_HOST": "b",
        "PODWIRE_AGENT_PHYSNET_MAPPINGS": "physnet1=eth1,physnet2=eth2",
        "PODWIRE_ETCD_ENDPOINTS": "http://127.0.0.1:1,http://127.0.0.1:2",
        "PODWIRE_POOL_PORT_DEBUG": "true",
        "PODWIRE_POOL_MIN": "7",
        "UNRELATED": "x",
    }
    settings = load_settings(path, env=env)
    assert settings.agent.host == "b"
    assert settings.agent.physnet_mappings == {"physnet1": "eth1", "physnet2": "eth2"}
    assert settings.etcd.endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert settings.pool.port_debug is True
    assert settings.pool.min == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agnet]\nhost = 'x'\n", r"unknown section \[agnet\]"),
        ("[agent]\nhsot = 'x'\n", r"agent.hsot: unknown key"),
        ("[pool]\nmin = 'five'\n", r"pool.min: expected int, got str"),
        ("[pool]\nport_debug = 1\n", r"pool.port_debug: expected bool, got int"),
        ("[pool]\nmin = 10\nmax = 5\n", r"pool.min: must not exceed pool.max"),
        ("[pool]\ndefault_driver = 'magic'\n", r"pool.default_driver"),
        ("[etcd]\nendpoints = []\n", r"etcd.endpoints: at least one"),
        ("[etcd]\nendpoints = ['127.0.0.1:2379']\n", r"etcd.endpoints: .* is not an http"),
        ("[etcd]\ncert_file = '/c'\n", r"etcd.cert_file and etcd.key_file"),
        ("[agent]\nhost = 'a/b'\n", r"agent.host: 'a/b' is not a valid name"),
        ("[agent]\nphysnet_mappings = { p = 'much-too-long-name0' }\n", r"physnet_mappings"),
        ("[agent]\nphysnet_mappings = { p = 3 }\n", r"expected a table of str"),
        ("[controller]\nlisten = 'nowhere'\n", r"controller.listen: 'nowhere' is not HOST:PORT"),
        ("[deviceplugin]\nresource_name = 'memif'\n", r"deviceplugin.resource_name"),
        ("[deviceplugin]\ndevices = 0\n", r"deviceplugin.devices"),
        ("[log]\nlevel = 'LOUD'\n", r"log.level"),
        ("[memif]\nmax_log2_ring = 16\n", r"memif.max_log2_ring: must be between 1 and 15"),
        ("[memif]\nmax_regions = 0\n", r"memif.max_regions"),
        ("[memif]\nnice = -21\n", r"memif.nice: must be between -20 and 19"),
        ("[memif]\nmax_flows = 0\n", r"memif.max_flows: must be between 1 and 16777216"),
        ("[memif]\nbinary = 'podwire-memif'\n", r"memif.binary: must be an absolute path"),
        ("agent = 3\n", r"\[agent\] must be a table"),
        ("[agent\n", r"is not valid TOML"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, text), env={})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PODWIRE_POOL_MIN": "many"}, r"PODWIRE_POOL_MIN: cannot parse 'many'"),
        ({"PODWIRE_POOL_PORT_DEBUG": "maybe"}, r"expected true or false"),
        ({"PODWIRE_POOL_SIZE": "3"}, r"PODWIRE_POOL_SIZE: unknown key pool.size"),
        ({"PODWIRE_AGENT_PHYSNET_MAPPINGS": "physnet1"}, r"key=value pairs"),
    ],
)
def test_bad_env_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env=env)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})


def test_config_check_names_every_problem_on_a_line_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from podwire.cli.main import main

    good = tmp_path / "good.toml"
    good.write_text("[agent]\nhost = 'node-1'\n[pool]\nmin = 2\n")
    assert main(["config", "check", str(good)]) == 0
    assert capsys.readouterr().err == ""
    bad = tmp_path / "bad.toml"
    bad.write_text("[agnet]\nhost = 'x'\n[pool]\nmin = 'five'\nmxa = 3\n[agent]\nhost = 'a/b'\n")
    assert main(["config", "check", str(bad)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4, lines
    assert all(line.startswith(f"{bad}: ") for line in lines)
    joined = "\n".join(lines)
    for problem in ("unknown section [agnet]", "pool.min: expected int", "pool.mxa: unknown key",
                    "agent.host: 'a/b' is not a valid name"):  # fmt: skip
        assert problem in joined
    assert main(["config", "check", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_etcd_endpoints_as_one_string_stay_valid(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[etcd]\nendpoints = "http://10.0.0.5:2379, http://10.0.0.6:2379"\n')
    assert load_settings(path, env={}).etcd.endpoints == [
        "http://10.0.0.5:2379",
        "http://10.0.0.6:2379",
    ]
    path.write_text('[etcd]\nendpoints = "http://10.0.0.5:2379"\n')
    assert load_settings(path, env={}).etcd.endpoints == ["http://10.0.0.5:2379"]


def test_pool_sizing_settings_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    for body, message in [
        ("headroom = 0.5", "pool.headroom: must be 1 or more"),
        ("rate_smoothing = 0.0", "pool.rate_smoothing"),
        ("idle_ttl = 0", "pool.idle_ttl: must be greater than 0"),
        ('adaptive = "yes"', "pool.adaptive: expected bool"),
    ]:
        path.write_text(f"[pool]\n{body}\n")
        with pytest.raises(ConfigError, match=message):
            load_settings(path, env={})


def test_agent_dataplane_none_is_a_setting(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agent]\ndataplane = "none"\n')
    assert load_settings(path, env={}).agent.dataplane == "none"
    path.write_text('[agent]\ndataplane = "dpdk"\n')
    with pytest.raises(ConfigError, match=r"agent\.dataplane: must be 'linux'"):
        load_settings(path, env={})


def test_deployment_is_a_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'deployment = "blue"\n[agent]\nhost = "n1"\n')
    settings = load_settings(path, env={})
    assert settings.deployment.name == "blue"
    assert settings.deployment.tag == "podwire-deployment=blue"
    assert settings.deployment.etcd_namespace == "/podwire-deployments/blue"
    assert load_settings(path, env={"PODWIRE_DEPLOYMENT": "green"}).deployment.name == "green"
    default = load_settings(env={}).deployment
    assert (default.name, default.etcd_namespace, default.adopts_untagged) == ("podwire", "", True)


@pytest.mark.parametrize("name", ["Blue", "a/b", "-x", "x" * 41, ""])
def test_bad_deployment_names_are_refused(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"deployment = {name!r}\n")
    with pytest.raises(ConfigError, match=r"deployment: .* is not a deployment name"):
        load_settings(path, env={})
    with pytest.raises(ConfigError, match=r"deployment: .* is not a deployment name"):
        load_settings(env={"PODWIRE_DEPLOYMENT": name})


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["podwire", "Blue"], "is not a deployment name"),
        (["blue", "blue"], "names a deployment twice"),
        ([], "name at least one deployment"),
        (["a/b"], "is not a deployment name"),
    ],
)
def test_a_list_of_deployments_is_read_strictly(names: list[str], problem: str) -> None:
    """The one reader of the ml2 driver's, the stack's and the etcd commands' lists."""
    with pytest.raises(ValidationError, match=rf"--x: .*{problem}"):
        deployments(names, "--x")
    assert [d.name for d in deployments([" podwire", "blue "], "--x")] == ["podwire", "blue"]
