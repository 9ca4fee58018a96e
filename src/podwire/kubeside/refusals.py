"""Which failures are worth a Kubernetes Event, and on which objects: what Neutron refused
(a quota used up, a request it will not take), as against an outage that says nothing about
the object (Neutron or etcd away, a term ending), which stays in the log and readiness.

A refused NetworkPolicy pass is named on the policies its plan was about to write (the
groups it made or gave rules to, and those whose rules name an address group it made or
changed): the other policies are enforced already and their Events would only mislead."""

from __future__ import annotations

from collections.abc import Iterable

from podwire.errors import PermanentError, RetryableError
from podwire.k8s.groups import DesiredPolicy
from podwire.k8s.objects import ObjectKey
from podwire.neutron.client import NeutronOverQuota, NeutronRequestError


class PolicyRefused(RetryableError):
    """Neutron refused a NetworkPolicy pass; retried with backoff like any failed pass."""

    cause = "netpol_refused"

    def __init__(self, message: str, policies: list[ObjectKey]) -> None:
        super().__init__(message)
        self.policies = policies


def refused(exc: BaseException) -> bool:
    """Whether Neutron refused (itself or as the cause of what the caller was told), rather
    than failed to answer."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NeutronOverQuota | NeutronRequestError):
            return True
        seen = seen.__cause__
    return False


def port_refused(exc: BaseException) -> bool:
    """A pod's port that no retry of the same request will get: a refusal, or a permanent
    failure (a network without a subnet or a free address, an unknown network)."""
    return refused(exc) or isinstance(exc, PermanentError)


def policies_in(
    desired: DesiredPolicy, policies: Iterable[ObjectKey], refusals: Iterable[str]
) -> list[ObjectKey]:
    """The policies whose groups (their own or their named ports') Neutron refused (by
    name), or whose rules name an address group it refused."""
    names = set(refusals)
    refused = {
        group.policy
        for group in desired.groups.values()
        if group.name in names or any(rule.remote_address_group in names for rule in group.rules)
    }
    return sorted((key for key in policies if key in refused), key=str)
