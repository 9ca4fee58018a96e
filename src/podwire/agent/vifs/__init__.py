"""Where a pod's port comes from (the controller's pools, or Neutron itself) and how it is
given back."""
