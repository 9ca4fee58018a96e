"""podwire: Neutron ports for Kubernetes pods, fast and without leaks."""

__version__ = "0.1.0"
