"""CNI 1.1 facts podwire relies on: versions, error codes, the error object.

A CNI error is printed on stdout as ``{"cniVersion", "code", "msg", "details"}`` with a
non-zero exit status; codes 1-99 are the spec's own.
"""

from __future__ import annotations

import json

from podwire.errors import PodwireError

SUPPORTED_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
CONTAINER_UNKNOWN = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN = 11
NOT_AVAILABLE = 50
CHECK_FAILED = 100  # plugin-specific: CHECK found the attachment not as ADD left it

COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")


class CniError(PodwireError):
    """An error the runtime gets as a CNI error object; ``msg`` says what to fix."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details
        self.retryable = code == TRY_AGAIN

    def to_json(self, version: str = LATEST) -> str:
        body = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            body["details"] = self.details
        return json.dumps(body)


def version_result(version: str = LATEST) -> str:
    return json.dumps({"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)})
