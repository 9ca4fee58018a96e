"""The manifests of podwire's VM image (``podwire vm build``), read back on every start.

- ``kernel/kernel.json``: which Debian kernel package the cached kernel and modules came
  from, and the modules in the order the guest loads them;
- ``image.json``: that kernel plus the busybox version and a digest of every input, so an
  up-to-date image is recognised without rebuilding it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from podwire.schema import doc, fields

DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,100}")
DEBIAN_VERSION = re.compile(r"[0-9A-Za-z.+~:-]{1,100}")
KERNEL_RELEASE = re.compile(r"[0-9A-Za-z._+-]{1,100}")
MODULE_NAME = re.compile(r"[a-z0-9_]{1,64}")
DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_MODULES = 64


def _matching(pattern: re.Pattern[str], rule: str) -> Any:
    def check(value: Any, what: str) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise fields.fail(what, f"{value!r} is not {rule}")
        return value

    return check


package_name = _matching(DEBIAN_PACKAGE, "a Debian package name")
package_version = _matching(DEBIAN_VERSION, "a Debian package version")
kernel_release = _matching(KERNEL_RELEASE, "a kernel release")
module_name = _matching(MODULE_NAME, "a kernel module name")
digest = _matching(DIGEST, "a sha256 digest")


@dataclass(frozen=True)
class KernelRecord:
    package: str  # linux-image-<release>
    version: str  # the package's Debian version
    release: str  # uname -r inside the guest
    modules: tuple[str, ...]  # load order: every module after those it depends on
    pvh: bool  # the unpacked ELF (vmlinux) is kept and booted as PVH
    wanted: tuple[str, ...]  # the modules asked for, which ``modules`` was resolved from

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "version": self.version,
            "release": self.release,
            "modules": list(self.modules),
            "pvh": self.pvh,
            "wanted": list(self.wanted),
        }

    @classmethod
    def from_json(cls, value: Any, what: str) -> KernelRecord:
        obj = doc.Obj(doc.as_object(value, what), what)
        return cls(
            package=obj.req("package", package_name),
            version=obj.req("version", package_version),
            release=obj.req("release", kernel_release),
            modules=tuple(obj.req("modules", _module_list)),
            pvh=obj.req("pvh", fields.boolean),
            wanted=tuple(obj.req("wanted", _module_list)),
        )

    def encode(self) -> bytes:
        return doc.encode_versioned(self.to_json())


def _module_list(value: Any, what: str) -> list[str]:
    return fields.each(value, what, module_name, MAX_MODULES)


def parse_kernel(raw: bytes, what: str) -> KernelRecord:
    return KernelRecord.from_json(doc.decode_versioned(raw, what), what)


@dataclass(frozen=True)
class ImageManifest:
    kernel: KernelRecord
    busybox_version: str
    inputs: str  # sha256 over everything the image is made of

    def encode(self) -> bytes:
        return doc.encode_versioned(
            {
                "kernel": self.kernel.to_json(),
                "busybox": self.busybox_version,
                "inputs": self.inputs,
            }
        )


def parse_manifest(raw: bytes, what: str) -> ImageManifest:
    obj = doc.Obj(doc.decode_versioned(raw, what), what)
    return ImageManifest(
        kernel=obj.req("kernel", KernelRecord.from_json),
        busybox_version=obj.req("busybox", package_version),
        inputs=obj.req("inputs", digest),
    )
