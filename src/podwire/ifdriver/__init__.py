"""The ``podwire`` interface driver: Neutron's DHCP and L3 agents' ports on podwire networks."""
