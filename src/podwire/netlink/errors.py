"""Kernel errors translated at the netlink boundary."""

from __future__ import annotations

import errno

from podwire.errors import PermanentError, RetryableError

# Errors that a later attempt can clear: the kernel was busy or a racing delete is finishing.
_TRANSIENT = {errno.EBUSY, errno.EAGAIN, errno.ENOBUFS, errno.EEXIST, errno.EINTR}


class NetlinkFailure(PermanentError):
    """A netlink request failed; ``code`` is the errno the kernel returned."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class NetlinkBusy(RetryableError):
    """A netlink request failed in a way that may clear up if repeated."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class NotANamespace(PermanentError):
    """A path that should name a network namespace does not."""


def translate(exc: Exception, what: str) -> Exception:
    code = int(getattr(exc, "code", 0) or getattr(exc, "errno", 0) or 0)
    reason = errno.errorcode.get(code, "") or str(exc)
    message = f"netlink {what}: {reason} ({exc})"
    if code in _TRANSIENT:
        return NetlinkBusy(message, code)
    return NetlinkFailure(message, code)
