"""Names vulture (run by scripts/check and scripts/test, over src only) reports as unused that
something outside podwire's own code calls or reads: reviewed, each with its reason. Vulture
matches by name alone, so an entry covers that name everywhere; keep this to framework hooks and
protocol tables, and delete code that is really unused instead of listing it here. A test's or
a benchmark's call does not make production code used: what only they need lives in tests/.
This file is read by vulture, never run."""

# Neutron loads the ML2 mechanism driver by its entry point and calls these hooks.
PodwireMechanismDriver
_.initialize
_.connectivity
_.bind_port
_.create_port_precommit
_.update_port_precommit
_.delete_port_precommit
_.create_port_postcommit
_.update_port_postcommit
_.delete_port_postcommit
_.check_vlan_transparency
_.check_vlan_qinq
_.trunk_driver  # the driver holds its trunk driver, whose registry callbacks Neutron calls
_.is_loaded  # neutron's trunk DriverBase asks it

# Neutron's DHCP and L3 agents load the interface driver by entry point
# (interface_driver = podwire) and read its device-name prefix.
PodwireInterfaceDriver
_.DEV_NAME_PREFIX

# neutron-db-manage finds the migrations by entry point; alembic reads these module names.
alembic_migrations
down_revision
branch_labels
upgrade

# kubelet calls the device plugin's servicer methods by the .proto's names (gRPC).
_.ListAndWatch
_.GetPreferredAllocation
_.Allocate
_.PreStartContainer

# The memif master's per-port stats record, read whole in the C struct's order
# (memif/master.py, PortStats); a field nothing shows yet is still on the wire.
_.connects

# prometheus_client calls a custom collector's describe() when it is registered.
_.describe

# The CNI specification's table of error codes, kept whole so it reads as the spec lists it.
UNSUPPORTED_FIELD

# tarfile writes these TarInfo fields (the images' layers, src/podwire/kube/images.py).
_.uname
_.gname
_.gid
_.mtime
_.linkname
