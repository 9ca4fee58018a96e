"""``[ml2_podwire]`` in neutron.conf: Neutron requires its plugins to use oslo.config."""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

GROUP = "ml2_podwire"

OPTS = [
    cfg.ListOpt(
        "etcd_endpoints",
        default=["http://127.0.0.1:2379"],
        help="etcd client URLs (http or https, all the same scheme).",
    ),
    cfg.FloatOpt("etcd_timeout", default=5.0, min=0.1, help="Seconds per etcd call."),
    cfg.StrOpt("etcd_ca_file", default="", help="CA bundle for https endpoints."),
    cfg.StrOpt("etcd_cert_file", default="", help="Client certificate."),
    cfg.StrOpt("etcd_key_file", default="", help="Client key."),
    cfg.StrOpt(
        "etcd_user",
        default="",
        help="etcd user (see `podwire etcd grant-server NAME --component ml2`).",
    ),
    cfg.StrOpt("etcd_password", default="", secret=True, help="That user's password."),
    cfg.ListOpt(
        "deployments",
        default=["podwire"],
        help="The podwire deployments whose nodes this Neutron binds ports to (several"
        " clusters sharing one Neutron and one etcd). A port goes to the deployment its host's"
        " agent registered in; the first one also holds the forwarder's election.",
    ),
    cfg.StrOpt(
        "vhostuser_socket_dir",
        default="/var/run/podwire/vhostuser",
        help="Directory in which vhost-user sockets of VM ports are created.",
    ),
    cfg.FloatOpt(
        "forwarder_poll_interval",
        default=10.0,
        min=0.1,
        help="Seconds between journal polls when no kick arrives (the safety net).",
    ),
    cfg.IntOpt(
        "forwarder_batch_size",
        default=100,
        min=1,
        max=128,
        help="Journal rows per etcd txn (etcd's default --max-txn-ops is 128).",
    ),
    cfg.IntOpt(
        "election_ttl",
        default=10,
        min=2,
        help="Lease TTL of the forwarder election: how long a dead leader blocks takeover.",
    ),
    cfg.FloatOpt(
        "startup_sync_timeout",
        default=10.0,
        min=0,
        help="Seconds a starting API worker waits for the host list before binding.",
    ),
]


def register(conf: Any = None) -> Any:
    """Register the options (idempotent) and return the group's values."""
    conf = conf or cfg.CONF
    conf.register_opts(OPTS, GROUP)
    return getattr(conf, GROUP)
