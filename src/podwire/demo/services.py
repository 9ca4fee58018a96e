"""The controller and agent processes of the demo, started like an operator would."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podwire.errors import StackError
from podwire.stack import procs
from podwire.stack.netutil import free_port, http_ok


@dataclass
class Services:
    work: Path
    etcd_url: str
    neutron_url: str
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    node_tokens: dict[str, str] = field(default_factory=dict)
    controller_port: int = field(default_factory=free_port)
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_level: str = "WARNING"  # the benches keep the INFO lines a node logs

    @property
    def controller_url(self) -> str:
        return f"http://127.0.0.1:{self.controller_port}"

    def _common(self) -> str:
        return f'[etcd]\nendpoints = ["{self.etcd_url}"]\n[log]\nlevel = "{self.log_level}"\n'

    def _spawn(self, name: str, component: str, config: str) -> None:
        path = self.work / f"{name}.toml"
        path.write_text(config)
        argv = [sys.executable, "-m", "podwire.cli.main", component, "--config", str(path)]
        self.children[name] = procs.spawn(argv, self.work / f"{name}.log")

    def start_controller(self, hosts: list[str], extra: str = "") -> None:
        """``extra``: more TOML after the controller's sections (a ``[kubernetes]``). A
        restart keeps each host's token, so its running agent is still let in."""
        self.node_tokens = {
            host: self.node_tokens.get(host) or secrets.token_hex(16) for host in hosts
        }
        tokens = ", ".join(f'"{host}" = "{token}"' for host, token in self.node_tokens.items())
        self._spawn(
            "controller",
            "controller",
            self._common()
            + f'[neutron]\nendpoint = "{self.neutron_url}"\n'
            + f'[controller]\nlisten = "127.0.0.1:{self.controller_port}"\n'
            + f'admin_token = "{self.admin_token}"\nnode_tokens = {{ {tokens} }}\n'
            + "[pool]\nmin = 0\nbatch = 10\nupdate_interval = 1\n"
            + extra,
        )
        self._wait("controller", lambda: http_ok(f"{self.controller_url}/readyz"))

    def start_agent(
        self, host: str, netns: str, vtep: str, extra: str = "", vif_source: str = "controller"
    ) -> str:
        """``extra``: more TOML for this agent's [agent] section and after it (the memif
        host's [deviceplugin]). ``vif_source = "neutron"``: ports straight from Neutron, no
        controller. Returns once the agent's own socket is there (a restart's, not the
        last run's)."""
        socket_path = str(self.work / f"{host}.sock")
        if vif_source == "neutron":
            source = 'vif_source = "neutron"\n'
            after = f'[neutron]\nendpoint = "{self.neutron_url}"\n'
        else:
            token = self.node_tokens[host]
            source = f'controller_url = "{self.controller_url}"\ntoken = "{token}"\n'
            after = ""
        before = _inode(socket_path)
        self._spawn(
            host,
            "agent",
            self._common()
            + f'[agent]\nhost = "{host}"\n{source}cni_socket = "{socket_path}"\n'
            + f'state_dir = "{self.work / host}"\nvtep_ip = "{vtep}"\n'
            + f'host_netns = "{netns}"\nheartbeat_ttl = 10\n'
            + extra
            + after,
        )
        self._wait(host, lambda: _inode(socket_path) not in (None, before))
        return socket_path

    def stop_child(self, name: str, timeout: float = 30.0) -> None:
        """As a service manager stops it (SIGTERM; an agent's pods keep running)."""
        proc = self.children.pop(name, None)
        if proc is not None:
            procs.stop_child(proc, timeout=timeout)

    def start_neutron_agent(self, kind: str, stack_dir: str, host: str, netns: str) -> None:
        """Neutron's DHCP or L3 agent for ``host``, as ``podwire neutron-agent KIND`` runs it."""
        argv = [
            *(sys.executable, "-m", "podwire.cli.main", "neutron-agent", kind),
            *("--data-dir", stack_dir, "--host", host, "--netns", netns),
        ]
        self.children[f"{kind}-agent"] = procs.spawn(argv, self.work / f"{kind}-agent.log")

    def _wait(self, name: str, ready: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        proc = self.children[name]
        while time.monotonic() < deadline:
            if ready():
                return
            if proc.poll() is not None:
                raise StackError(f"{name} exited; see {self.work / (name + '.log')}")
            time.sleep(0.1)
        raise StackError(f"{name} not ready after {timeout:.0f} s")

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.controller_url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read() or b"null")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.controller_url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def stop_neutron_agents(self) -> None:
        """Before the ports go: a running DHCP agent would make its port again."""
        for kind in ("dhcp", "l3"):
            self.stop_child(f"{kind}-agent", timeout=60)

    def stop(self) -> None:
        self.stop_neutron_agents()
        for name in [n for n in self.children if n != "controller"] + ["controller"]:
            self.stop_child(name)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
