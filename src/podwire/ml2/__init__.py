"""Code that runs inside neutron-server: the ML2 mechanism driver and its trunk driver."""
