"""Neutron access through openstacksdk, the only Neutron client podwire uses."""
