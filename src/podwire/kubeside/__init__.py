"""The controller's Kubernetes side: what the leader runs over the Kubernetes API in each term
with ``[kubernetes] kubeconfig`` (``side.KubernetesSide``): the NetworkPolicy reconciler and the
ports that follow it, the namespaces' networks, the pods' port annotations, the release of what
pods and Nodes gone from the API held, the Services for the agents (docs/kubernetes.md).

A floor below the controller: it never imports it. What it uses of the controller's pools is
named by the protocols in ``pools``, which the controller's own classes satisfy as they are;
``controller.app`` hands them in."""
