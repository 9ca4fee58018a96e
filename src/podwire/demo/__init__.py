"""``scripts/demo``: the whole system doing its main job on one machine.

A local stack (etcd + MariaDB + Neutron with the podwire driver), a controller, and two agents
on two simulated hosts (network namespaces joined by an underlay bridge). Pods are namespaces
attached through the real CNI plugin binary; they must all reach each other over VXLAN.
"""
