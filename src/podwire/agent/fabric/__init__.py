"""The node among the others: its registration and heartbeat, the wiring of the ports Neutron
bound here, and the other nodes' ports (claims checked against Neutron) on each network's
VXLAN device."""
