"""Runs the podwire interface driver's methods in a process of its own, as an agent would.

Neutron's ``ip_lib`` works through privsep daemons and oslo.config's global ``CONF``: a child
process keeps both out of the test runner. The daemons are forked from this process (it runs as
root), which is what ``[privsep] helper_command`` amounts to in an agent. Usage:
``ifdriver_proc.py HOST HOST_NETNS ADOPT_TIMEOUT`` and one JSON call per stdin line,
``{"method": "plug", "args": [...]}``; each answer is one JSON line
``{"ok": true}`` or ``{"ok": false, "error": "ClassName", "message": "..."}``.
"""

from __future__ import annotations

import json
import sys

from neutron import privileged
from neutron.conf import common as common_config
from neutron.conf.agent import common as agent_config
from oslo_config import cfg
from oslo_privsep import priv_context

from podwire.ifdriver import options
from podwire.ifdriver.driver import PodwireInterfaceDriver


def main() -> None:
    host, host_netns, adopt_timeout = sys.argv[1], sys.argv[2], sys.argv[3]
    conf = cfg.CONF
    common_config.register_core_common_config_opts(conf)
    agent_config.register_interface_opts(conf)
    conf([], project="neutron")
    conf.set_override("host", host)
    options.register(conf)
    conf.set_override("host_netns", host_netns, group="podwire")
    conf.set_override("adopt_timeout", float(adopt_timeout), group="podwire")
    driver = PodwireInterfaceDriver(conf)
    for context in (privileged.default, privileged.link_cmd, privileged.namespace_cmd):
        context.start(priv_context.Method.FORK)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        call = json.loads(line)
        try:
            getattr(driver, call["method"])(*call["args"])
        except Exception as exc:
            answer = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        else:
            answer = {"ok": True}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
