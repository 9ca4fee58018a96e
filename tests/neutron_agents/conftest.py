"""Fixtures of the Neutron-agent suite: namespaces, the driver process, DHCP agents."""

from __future__ import annotations

from tests.agent.conftest import netenv  # noqa: F401  (namespaces removed whatever happens)
