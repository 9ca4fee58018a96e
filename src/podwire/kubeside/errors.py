"""The refusals the Kubernetes side gives a pod's VIF request: retryable (kubelet asks again),
so the VIF API answers them as it answers every retryable error, 503 naming their ``cause``."""

from __future__ import annotations

from podwire.errors import RetryableError


class PolicyNotReady(RetryableError):
    """The NetworkPolicy groups of the request's pod cannot be decided yet (the apiserver not
    read yet, the pod not known to it, its policies' groups not in Neutron yet): a port
    handed out without them would let traffic through that a policy denies."""

    cause = "policy_not_ready"


class NamespaceNetworkNotReady(RetryableError):
    """The network of the request's pod's namespace cannot be used yet: its annotation is
    malformed or names a network Neutron does not have, or its ``auto`` network is still
    being made. Retryable: the namespace's owner may fix it, and kubelet asks again."""

    cause = "namespace_network"
