"""``podwire neutron-agent KIND``: one of Neutron's own agents for one host of the local stack.

The agent (``neutron-dhcp-agent`` or ``neutron-l3-agent``) runs as a child in the root
namespace, where the stack's RabbitMQ and Neutron listen; with ``--netns`` the host ends of its
ports go into that simulated host's namespace (the interface driver's ``[podwire] host_netns``).
It serves in the foreground until SIGTERM/SIGINT; then, and also before it starts, what the
agent made for this host is removed (``agent_cleanup``). One agent of a kind per host and data
dir: a lock file says so.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podwire.errors import StackError
from podwire.log import get_logger
from podwire.netlink import is_netns, netns_path
from podwire.schema import fields
from podwire.stack import agent_cleanup, procs
from podwire.stack.agent_conf import AgentConfig
from podwire.stack.runner import (
    StopRequested,
    install_stop_handlers,
    read_stack_json,
    restore_signal_handlers,
)

log = get_logger(__name__)

CLEANERS: dict[str, Callable[[Path, str], None]] = {
    "dhcp": agent_cleanup.clean_dhcp,
    "l3": agent_cleanup.clean_l3,
}
AGENTS_DIR = "neutron-agents"


@dataclass(frozen=True)
class AgentOptions:
    kind: str  # a key of CLEANERS
    data_dir: Path
    host: str
    netns: str = ""
    adopt_timeout: float = 10.0
    stop_timeout: float = 30.0


def agent_base(data_dir: Path, host: str, kind: str) -> Path:
    """Where the agent of ``kind`` for ``host`` keeps its files, config, state and log."""
    return data_dir / AGENTS_DIR / host / kind


def agent_config(options: AgentOptions) -> AgentConfig:
    """The agent's files for the stack on ``options.data_dir``; refused without an RPC bus."""
    data_dir = options.data_dir.resolve()
    host = fields.name(options.host, "--host")
    if options.netns and not is_netns(netns_path(options.netns)):
        raise StackError(f"--netns: no network namespace named {options.netns}")
    info = read_stack_json(data_dir)
    if info is None:
        raise StackError(f"no stack is running on {data_dir}")
    transport_url = info.get("transport_url")
    if not isinstance(transport_url, str) or not transport_url:
        raise StackError(
            f"the stack on {data_dir} has no RPC bus (no transport_url in stack.json):"
            " start it with podwire stack up --rpc"
        )
    return AgentConfig(
        kind=options.kind,
        base=agent_base(data_dir, host, options.kind),
        host=host,
        transport_url=transport_url,
        host_netns=options.netns,
        adopt_timeout=options.adopt_timeout,
    )


def run_agent(options: AgentOptions, on_ready: Callable[[dict[str, Any]], None]) -> int:
    """Serve until a signal (0) or until the agent exits by itself (1); clean up either way."""
    config = agent_config(options)
    clean = CLEANERS[options.kind]
    config.base.mkdir(parents=True, exist_ok=True)
    with _agent_lock(config):
        config.write()
        _stop_leftovers(config)
        clean(config.state_path, config.host)
        previous = install_stop_handlers()
        proc = None
        try:
            proc = procs.spawn(config.argv(), config.base / f"{config.kind}-agent.out")
            log.info("neutron_agent.started", kind=config.kind, host=config.host, pid=proc.pid)
            on_ready(_announcement(config, proc.pid))
            while proc.poll() is None:
                time.sleep(0.2)
            log.error("neutron_agent.exited", kind=config.kind, code=proc.returncode)
            return 1
        except StopRequested:
            return 0
        finally:
            if proc is not None:
                procs.stop_child(proc, timeout=options.stop_timeout)
            _stop_leftovers(config)
            clean(config.state_path, config.host)
            log.info("neutron_agent.stopped", kind=config.kind, host=config.host)
            restore_signal_handlers(previous)


def _stop_leftovers(config: AgentConfig) -> None:
    """Helpers the agent started that outlived it (its privsep daemons, whose command lines
    name its config files); a crashed run leaves them too, so this runs at start as well."""
    marker = str(config.etc)
    for pid in procs.pids_marked(marker):
        if procs.terminate(pid, marker, timeout=5):
            log.info("neutron_agent.helper_stopped", kind=config.kind, pid=pid)


def _announcement(config: AgentConfig, pid: int) -> dict[str, Any]:
    return {
        "kind": config.kind,
        "host": config.host,
        "pid": pid,
        "log": str(config.log_file),
        "state_path": str(config.state_path),
        "config_files": [str(path) for path in config.files],
    }


@contextmanager
def _agent_lock(config: AgentConfig) -> Iterator[None]:
    handle = (config.base / "agent.lock").open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StackError(
                f"a {config.kind} agent for host {config.host} already runs on this stack"
            ) from exc
        yield
    finally:
        handle.close()
