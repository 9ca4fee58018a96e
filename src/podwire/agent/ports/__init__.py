"""The node's end of each port: a pod's veth, a VM's or a Neutron agent's tap, a memif served
by the node's master; the attachments' checkpoint."""
