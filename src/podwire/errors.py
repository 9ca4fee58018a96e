"""podwire's exception hierarchy.

Every error a caller can act on is either *retryable* (the same call may succeed later: a
component is down, a lease was lost, a pool is still filling) or *permanent* (the input or the
configuration is wrong and repeating will not help). Third-party exceptions are translated into
these at the module that talks to the third party, with ``raise ... from exc``.
"""


class PodwireError(Exception):
    """Base of every error podwire raises on purpose."""

    retryable = False
    # What kind of failure it is, for programs (the VIF API's "cause"); words are the message.
    cause = "error"


class RetryableError(PodwireError):
    """The operation may succeed if repeated later."""

    retryable = True


class PermanentError(PodwireError):
    """Repeating the operation unchanged will fail again."""


class UnknownResource(PermanentError):
    """A network, project or security group the request names does not exist (HTTP 404)."""

    cause = "unknown"


class UnknownNetwork(UnknownResource):
    cause = "unknown_network"


class ConfigError(PermanentError):
    """A setting is missing, unknown or has a bad value; the message names the key."""

    cause = "config"


class ValidationError(PermanentError):
    """An input from outside (etcd value, request body, CNI input) is malformed."""

    cause = "bad_request"


class EtcdUnavailable(RetryableError):
    """etcd could not be reached or did not answer in time."""

    cause = "etcd_unavailable"


class EtcdCompacted(RetryableError):
    """A watch asked for a revision that etcd has already compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted; oldest available is {compact_revision}")
        self.compact_revision = compact_revision


class NotLeader(RetryableError):
    """This process lost (or never had) the leadership a fenced write required."""

    cause = "not_leader"


class StackError(PermanentError):
    """The local stack could not be started or stopped; the message says why."""


class TapNotAdopted(RetryableError):
    """podwire's node agent did not take an interface driver's tap onto a bridge in time."""


class ForeignDevice(PermanentError):
    """A device with the name podwire would use exists and is not podwire's: left alone."""


class VmError(PermanentError):
    """A VM image could not be built, a VM could not start, or its guest stopped answering;
    the message says which and why."""


class VmCommandTimeout(VmError):
    """A command run in a VM's guest did not finish within its time limit."""


class KubeError(PermanentError):
    """A Kubernetes node of the local stack (``podwire kube-node``) could not start or stop
    cleanly; the message says which part and why."""


class KubeApiError(RetryableError):
    """The Kubernetes API could not be reached or refused a call; the message says which
    resource and why. Retried with backoff: the apiserver is another process that comes back."""

    cause = "kube_api"


class KubeResourceExpired(KubeApiError):
    """A watch asked for a resourceVersion the apiserver no longer keeps (410 Gone): the
    watcher lists again, once, and watches from the new list's version."""
