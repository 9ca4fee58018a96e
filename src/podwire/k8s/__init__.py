"""The Kubernetes side of the controller: informers over the API and the pure NetworkPolicy
compiler (docs/kubernetes.md, "NetworkPolicy"). A component on its own floor: it talks to the
apiserver only through ``k8s/api.py`` and knows nothing of the controller or Neutron's client."""
