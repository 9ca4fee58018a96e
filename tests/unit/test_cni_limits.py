"""Both plugin builds and the agent agree on the config limits and the socket's default path
(three copies each, one rule: the plugins can import nothing of podwire)."""

from __future__ import annotations

import re
from pathlib import Path

from podwire.agent.cni import request
from podwire.agent.cni import socket_proto as wire
from podwire.cni import plugin
from podwire.config import AGENT_SOCKET

C_SOURCE = Path(plugin.__file__).with_name("c") / "podwire-cni.c"


def _c_define(name: str) -> int:
    found = re.search(rf"^#define {name} \((\d+) << (\d+)\)$", C_SOURCE.read_text(), re.M)
    assert found, name
    return int(found[1]) << int(found[2])


def test_plugins_use_the_agents_limits() -> None:
    assert plugin.MAX_CONFIG == request.MAX_CONFIG == _c_define("MAX_CONFIG")
    assert plugin.MAX_CONFIG_EXTRA == request.MAX_CONFIG_EXTRA == _c_define("MAX_CONFIG_EXTRA")


def test_plugins_look_where_the_agent_listens_by_default() -> None:
    found = re.search(r'^#define DEFAULT_SOCKET "([^"]+)"$', C_SOURCE.read_text(), re.M)
    assert found
    assert plugin.DEFAULT_SOCKET == found[1] == AGENT_SOCKET


def test_the_request_limit_fits_the_largest_config_escaped() -> None:
    largest = request.config_limit("DEL")
    assert largest == request.MAX_CONFIG + request.MAX_CONFIG_EXTRA
    assert 6 * largest + 6 * 6 * wire.MAX_ENV_VALUE <= wire.MAX_REQUEST


def test_config_size_counts_bytes_not_characters() -> None:
    request.check_config_size("é" * (request.MAX_CONFIG // 2), "ADD")
    try:
        request.check_config_size("é" * (request.MAX_CONFIG // 2 + 1), "ADD")
    except request.CniError as exc:
        assert exc.code == 6 and "too large" in exc.msg
    else:
        raise AssertionError("a config of more than MAX_CONFIG bytes was accepted")
