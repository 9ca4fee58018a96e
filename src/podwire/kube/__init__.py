"""A Kubernetes node per simulated host of the local stack (``podwire kube-node``): a private
containerd, a real kubelet, the offline images they need, and the CRI client that removes the
node's pods before it goes."""
