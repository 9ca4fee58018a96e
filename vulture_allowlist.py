"""Names vulture (run by scripts/check) reports as unused that something outside podwire's own
code calls or reads: reviewed, each with its reason. Vulture matches by name alone, so an entry
covers that name everywhere; keep this to framework hooks and protocol tables, and delete code
that is really unused instead of listing it here. This file is read by vulture, never run."""

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

# Neutron's LinuxInterfaceDriver reads its subclass's device-name prefix.
_.DEV_NAME_PREFIX

# neutron-db-manage finds the migrations by entry point; alembic reads these module names.
alembic_migrations
down_revision
branch_labels
upgrade

# gRPC calls the servicer methods by the .proto's names (the kubelet peer's PodResources API).
_.List
_.Get
_.GetAllocatableResources

# prometheus_client calls a custom collector's describe() when it is registered.
_.describe

# The CNI specification's table of error codes, kept whole so it reads as the spec lists it.
UNSUPPORTED_FIELD

# pytest reads these by name: module marks, a configure and a collection hook, an autouse
# fixture.
pytestmark
pytest_configure
pytest_collection_modifyitems
restore_root_logger

# tarfile writes these TarInfo fields (the images' layers, src/podwire/kube/images.py).
_.uname
_.gname
_.gid
_.mtime
_.linkname
