"""The embedded local stack: etcd, MariaDB and the real Neutron API on loopback."""
