"""Which pool driver serves a node (no stack): its registered pod driver, else the default, by
the names nodes and the config use; an earlier name still works and is logged as deprecated."""

from __future__ import annotations

from typing import Any

import pytest

from podwire import keys
from podwire.config import load_settings
from podwire.controller.drivers import NodeDrivers
from podwire.etcd import KeyValue
from podwire.schema.nodes import POD_DRIVERS, capabilities_value


class Registrations:
    """The capabilities keys of some nodes, as etcd would answer ``get``."""

    def __init__(self, pod_drivers: dict[str, str | None]) -> None:
        self._values = {
            keys.state_capabilities(node): capabilities_value(["veth"], ["vxlan"], driver)
            for node, driver in pod_drivers.items()
        }

    async def get(self, key: str) -> KeyValue | None:
        value = self._values.get(key)
        return None if value is None else KeyValue(key, value, 1, 1, 1, 0)


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


def _drivers(etcd: Any, default: str) -> NodeDrivers:
    return NodeDrivers(etcd, {name: Named(name) for name in POD_DRIVERS}, default)


async def test_a_node_gets_the_driver_it_registered_else_the_default() -> None:
    etcd = Registrations({"n-nested": "nested", "n-old": "noop", "n-none": None})
    drivers = _drivers(etcd, "baremetal")
    assert (await drivers.for_node("n-nested")).name == "nested"
    assert (await drivers.for_node("n-old")).name == "unpooled"
    assert (await drivers.for_node("n-none")).name == "baremetal"
    assert (await drivers.for_node("n-unregistered")).name == "baremetal"


async def test_the_earlier_default_name_serves_unpooled_and_says_it_is_deprecated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    drivers = _drivers(Registrations({}), "noop")
    assert (await drivers.for_node("n1")).name == "unpooled"
    (record,) = [r for r in caplog.records if r.getMessage() == "controller.config.deprecated"]
    assert record.fields == {"key": "pool.default_driver", "value": "noop", "use": "unpooled"}


def test_the_config_accepts_the_pod_drivers_and_the_earlier_name(tmp_path: Any) -> None:
    for name in (*POD_DRIVERS, "noop"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f"[pool]\ndefault_driver = '{name}'\n")
        assert load_settings(path, env={}).pool.default_driver == name
