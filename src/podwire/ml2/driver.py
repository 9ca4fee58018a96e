"""The ``podwire`` ML2 mechanism driver as loaded by neutron-server.

Binding decisions read the in-memory host cache only (a request thread must never wait on
etcd). Desired-state changes go to the journal inside ML2's transaction; the background worker
forwards them to etcd and turns agent feedback into port status.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from neutron.db import provisioning_blocks
from neutron_lib.api.definitions import portbindings
from neutron_lib.callbacks import events, registry, resources
from neutron_lib.db import api as db_api
from neutron_lib.plugins.ml2 import api
from oslo_config import cfg

from podwire import keys
from podwire.config import EtcdSettings
from podwire.errors import ValidationError
from podwire.log import get_inline_logger
from podwire.ml2 import binding, journal, options, policy
from podwire.ml2.desired import bound_segment, desired_port
from podwire.ml2.forwarder import ForwarderSettings
from podwire.ml2.host_cache import HostDirectory
from podwire.ml2.policy_callbacks import PolicyJournal
from podwire.ml2.policy_db import PolicySnapshot
from podwire.ml2.trunk_driver import PodwireTrunkDriver
from podwire.schema.deployment import Deployment, deployments

if TYPE_CHECKING:
    from podwire.ml2.worker import Worker

log = get_inline_logger(__name__)


def _segments(context: Any) -> list[binding.Segment]:
    return [
        binding.Segment(
            id=segment[api.ID],
            network_type=segment[api.NETWORK_TYPE],
            physnet=segment.get(api.PHYSICAL_NETWORK),
            segmentation_id=segment.get(api.SEGMENTATION_ID),
        )
        for segment in context.segments_to_bind
    ]


def _deployments(names: list[str]) -> list[Deployment]:
    """``[ml2_podwire] deployments``, read strictly: a bad name stops neutron-server's start
    with the option named, as any other bad Neutron option does."""
    try:
        return deployments(names, "[ml2_podwire] deployments")
    except ValidationError as exc:
        raise cfg.Error(str(exc)) from exc


class PodwireMechanismDriver(api.MechanismDriver):  # type: ignore[misc]
    def initialize(self) -> None:
        self.conf = options.register()
        self.hosts = HostDirectory(_deployments(self.conf.deployments))
        self.trunk_driver = PodwireTrunkDriver.create()
        self.etcd = EtcdSettings(
            endpoints=list(self.conf.etcd_endpoints),
            ca_file=self.conf.etcd_ca_file,
            cert_file=self.conf.etcd_cert_file,
            key_file=self.conf.etcd_key_file,
            user=self.conf.etcd_user,
            password=self.conf.etcd_password,
            timeout=self.conf.etcd_timeout,
        )
        self.etcd.validate()
        self.journal = journal.SqlJournal(cfg.CONF.database.connection)
        self.worker: Worker | None = None
        PolicyJournal(self._kick_worker).subscribe()
        # The worker (threads, an etcd channel, the forwarder's identity) belongs to the process
        # that serves requests. The API's gunicorn worker builds the plugin and publishes
        # AFTER_INIT itself; neutron-rpc-server builds it in a parent that then forks its RPC
        # workers, each publishing AFTER_INIT: threads and gRPC channels do not survive a fork.
        registry.subscribe(self._start_worker, resources.PROCESS, events.AFTER_INIT)

    def _start_worker(self, _resource: str, _event: str, _trigger: Any, **_kwargs: Any) -> None:
        if self.worker is not None:
            return
        # Imported here: neutron_sink pulls in the ML2 plugin machinery, which only a running
        # neutron-server has fully set up.
        from podwire.ml2.neutron_sink import NeutronPortStatus
        from podwire.ml2.worker import Worker

        forwarder = ForwarderSettings(
            identity=f"{socket.gethostname()}:{os.getpid()}",
            election_key=self.hosts.home.etcd_namespace + keys.election("forwarder"),
            kick_key=self.hosts.home.etcd_namespace + keys.KICK,
            lease_ttl=self.conf.election_ttl,
            batch_size=self.conf.forwarder_batch_size,
            poll_interval=self.conf.forwarder_poll_interval,
        )
        self.worker = Worker(
            self.etcd,
            self.hosts,
            self.journal,
            NeutronPortStatus(),
            forwarder,
            journal_depth=self.journal.depth,
            policy=PolicySnapshot(cfg.CONF.database.connection),
        )
        self.worker.start()
        if not self.hosts.wait_synced(self.conf.startup_sync_timeout):
            log.warning("ml2.driver.host_state_not_synced", timeout=self.conf.startup_sync_timeout)
        log.info("ml2.driver.initialized", pid=os.getpid(), etcd=",".join(self.etcd.endpoints))

    def _kick_worker(self) -> None:
        if self.worker is not None:
            self.worker.kick()

    @property
    def connectivity(self) -> str:
        return str(portbindings.CONNECTIVITY_L2)

    def check_vlan_transparency(self, context: Any) -> bool:
        """A VLAN-transparent (or QinQ) network would carry its VMs' own VLAN tags: podwire's
        bridges, VXLAN devices and port filters do not, so it refuses (Neutron then refuses
        the network, whatever other drivers say) rather than bind ports it cannot serve."""
        return False

    def check_vlan_qinq(self, context: Any) -> bool:
        return False

    def bind_port(self, context: Any) -> None:
        port = context.current
        host = context.host or ""
        decision = binding.decide(
            vnic_type=port.get(portbindings.VNIC_TYPE, portbindings.VNIC_NORMAL),
            device_owner=port.get("device_owner") or "",
            port_id=port["id"],
            segments=_segments(context),
            host=self.hosts.get(host),
            vhostuser_dir=self.conf.vhostuser_socket_dir,
        )
        if isinstance(decision, binding.Binding) and len(self.hosts.deployments) > 1:
            decision = self._network_shared(context, host) or decision
        if isinstance(decision, binding.Decline):
            log.info("ml2.bind.declined", port=port["id"], host=host, reason=decision.reason)
            return
        context.set_binding(decision.segment.id, decision.vif_type, decision.vif_details)
        log.info("ml2.bind.bound", port=port["id"], host=host, vif_type=decision.vif_type)

    def _network_shared(self, context: Any, host: str) -> binding.Decline | None:
        """A network belongs to one deployment: agents learn their peers from their own
        deployment's keys only, so a port of another deployment's host on it would be bound
        and never reach the rest of the network."""
        from neutron.db.models_v2 import Port
        from neutron.plugins.ml2.models import PortBinding

        mine = self.hosts.deployment_of(host)
        network_id = context.network.current["id"]
        with db_api.CONTEXT_READER.using(context.plugin_context):
            rows = (
                context.plugin_context.session.query(PortBinding.host)
                .join(Port, Port.id == PortBinding.port_id)
                .filter(Port.network_id == network_id, PortBinding.host != "")
                .distinct()
                .all()
            )
        for (other,) in rows:
            owner = self.hosts.claimed_by(other)
            if other != host and owner is not None and owner != mine:
                return binding.Decline(
                    f"network {network_id} is used by deployment {owner.name} (host {other});"
                    f" host {host} is in deployment {mine.name}"
                )
        return None

    # --- journal ---------------------------------------------------------------------------

    def create_port_precommit(self, context: Any) -> None:
        self._journal_membership(context, None, context.current)
        segment = bound_segment(context.binding_levels)
        if segment is None or not context.host:
            return
        self._journal_put(context, context.host, segment)

    def update_port_precommit(self, context: Any) -> None:
        self._journal_membership(context, context.original, context.current)
        port_id = context.current["id"]
        old_segment = bound_segment(context.original_binding_levels)
        new_segment = bound_segment(context.binding_levels)
        old_host, new_host = context.original_host or "", context.host or ""
        if old_segment is not None and old_host and (new_segment is None or old_host != new_host):
            self._journal(context, self._port_key(old_host, port_id), None)
        if new_segment is None or not new_host:
            return
        rebound = (
            old_segment is None
            or old_host != new_host
            or context.original_vif_type != context.vif_type
        )
        if not rebound:
            assert old_segment is not None
            before = desired_port(
                context,
                context.original,
                old_segment,
                context.original_vif_type,
                context.original_vif_details,
            )
            after = desired_port(
                context, context.current, new_segment, context.vif_type, context.vif_details
            )
            if before.encode() == after.encode():
                return  # status-only update: nothing for the agent
            self._journal(context, self._port_key(new_host, port_id), after.encode())
            return
        self._journal_put(context, new_host, new_segment)
        with db_api.CONTEXT_WRITER.using(context.plugin_context):
            provisioning_blocks.add_provisioning_component(
                context.plugin_context,
                port_id,
                resources.PORT,
                provisioning_blocks.L2_AGENT_ENTITY,
            )

    def delete_port_precommit(self, context: Any) -> None:
        self._journal_membership(context, context.current, None)
        segment = bound_segment(context.binding_levels)
        if segment is not None and context.host:
            self._journal(context, self._port_key(context.host, context.current["id"]), None)

    def _journal_put(self, context: Any, host: str, segment: dict[str, Any]) -> None:
        value = desired_port(
            context, context.current, segment, context.vif_type, context.vif_details
        )
        self._journal(context, self._port_key(host, value.port_id), value.encode())

    def _port_key(self, host: str, port_id: str) -> str:
        """The desired port's key in the deployment ``host`` belongs to."""
        return self.hosts.key(host, keys.node_port(host, port_id))

    def _journal_membership(
        self, context: Any, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> None:
        """Member keys for every group of every port, podwire's or not: a rule naming a group
        admits all its members, wherever they are wired."""
        changes = policy.membership_changes(
            policy.port_membership(before), policy.port_membership(after)
        )
        for key, value in changes:
            self._journal(context, key, value)

    @staticmethod
    def _journal(context: Any, key: str, value: str | None) -> None:
        with db_api.CONTEXT_WRITER.using(context.plugin_context):
            journal.add(context.plugin_context.session, key, value)

    def create_port_postcommit(self, context: Any) -> None:
        self._kick(context)

    def update_port_postcommit(self, context: Any) -> None:
        self._kick(context)

    def delete_port_postcommit(self, context: Any) -> None:
        self._kick(context)

    def _kick(self, context: Any) -> None:
        levels = [context.binding_levels, getattr(context, "original_binding_levels", None)]
        ports = [context.current, getattr(context, "original", None)]
        if any(bound_segment(level) is not None for level in levels) or any(
            port and port.get("security_groups") for port in ports
        ):
            self._kick_worker()
