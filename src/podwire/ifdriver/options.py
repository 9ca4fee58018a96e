"""``[podwire]`` in the DHCP or L3 agent's config (oslo.config, as Neutron's agents read it)."""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

GROUP = "podwire"

OPTS = [
    cfg.StrOpt(
        "host_netns",
        default="",
        help="Network namespace of the host's network stack, where the tap ends of the"
        " agent's ports go and podwire's node agent adopts them. Empty: the agent's own"
        " namespace (a production node). A simulated host is a namespace of its own.",
    ),
    cfg.FloatOpt(
        "adopt_timeout",
        default=10.0,
        min=0.0,
        help="Seconds a plug waits for podwire's node agent to put the new tap on the"
        " network's bridge; then the pair is removed and the plug fails (0: do not wait).",
    ),
]


def register(conf: Any) -> Any:
    conf.register_opts(OPTS, group=GROUP)
    return conf.podwire
