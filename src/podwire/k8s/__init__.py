"""The Kubernetes API as podwire reads it: informers over the API and the pure NetworkPolicy
compiler (docs/kubernetes.md, "NetworkPolicy"). A floor below the controller's Kubernetes side
(``podwire.kubeside``), which runs it in each leader term: it talks to the apiserver only
through ``k8s/api.py`` and knows nothing of the controller or Neutron's client."""
