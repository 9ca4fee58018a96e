"""The VM image's pure parts: the cpio writer, module order, PVH detection, the manifests."""

from __future__ import annotations

import lzma
import stat
import struct
from pathlib import Path

import pytest

from podwire.errors import ValidationError, VmError
from podwire.schema.vmimage import ImageManifest, KernelRecord, parse_kernel, parse_manifest
from podwire.vm import cpio, kernel, pvh


def read_cpio(data: bytes) -> list[tuple[str, int, bytes, tuple[int, int], int]]:
    """(path, mode, data, rdev, mtime) of each entry of a newc archive, trailer excluded."""
    entries, position = [], 0
    while True:
        assert data[position : position + 6] == b"070701"
        values = [int(data[position + 6 + 8 * i : position + 14 + 8 * i], 16) for i in range(13)]
        mode, mtime, size, rmajor, rminor, name_size = (
            values[1],
            values[5],
            values[6],
            values[9],
            values[10],
            values[11],
        )
        name_start = position + 110
        name = data[name_start : name_start + name_size - 1].decode()
        body_start = name_start + name_size + (-(110 + name_size) % 4)
        body = data[body_start : body_start + size]
        position = body_start + size + (-size % 4)
        if name == cpio.TRAILER:
            assert position == len(data)
            return entries
        entries.append((name, mode, body, (rmajor, rminor), mtime))


def test_cpio_round_trips_files_links_devices_and_is_deterministic() -> None:
    entries = cpio.with_parents(
        [
            cpio.file("etc/a/b.txt", b"hello"),
            cpio.file("bin/tool", b"\x7fELF...", executable=True),
            cpio.symlink("bin/sh", "tool"),
            cpio.char_device("dev/console", 5, 1),
        ]
    )
    data = cpio.archive(entries)
    assert data == cpio.archive(entries)
    assert len(data) % 4 == 0
    parsed = {name: (mode, body, rdev, mtime) for name, mode, body, rdev, mtime in read_cpio(data)}
    assert [name for name, *_ in read_cpio(data)][:3] == ["etc", "etc/a", "etc/a/b.txt"]
    assert parsed["etc/a/b.txt"][:2] == (stat.S_IFREG | 0o644, b"hello")
    assert parsed["bin/tool"][0] == stat.S_IFREG | 0o755
    assert parsed["bin/sh"][:2] == (stat.S_IFLNK | 0o777, b"tool")
    assert parsed["dev/console"][0] == stat.S_IFCHR | 0o600
    assert parsed["dev/console"][2] == (5, 1)
    assert {mtime for *_, mtime in parsed.values()} == {0}


def test_with_parents_creates_each_directory_once_before_its_contents() -> None:
    entries = [cpio.file("a/b/c", b""), cpio.directory("a"), cpio.file("a/d", b"")]
    assert [e.path for e in cpio.with_parents(entries)] == ["a", "a/b", "a/b/c", "a/d"]


def _module(tmp: Path, name: str, depends: str) -> Path:
    path = tmp / f"{name}.ko"
    path.write_bytes(b"\x7fELF\0junk\0license=GPL\0depends=" + depends.encode() + b"\0name=x\0")
    return path


def test_load_order_puts_every_module_after_its_dependencies(tmp_path: Path) -> None:
    available = {
        "virtio_net": _module(tmp_path, "virtio_net", "virtio_ring,virtio,net_failover"),
        "net_failover": _module(tmp_path, "net_failover", "failover"),
        "failover": _module(tmp_path, "failover", ""),
        "virtio": _module(tmp_path, "virtio", "virtio_ring"),
        "virtio_ring": _module(tmp_path, "virtio_ring", ""),
    }
    order = kernel.load_order(("virtio_net",), available, set())
    assert order == ["virtio_ring", "virtio", "failover", "net_failover", "virtio_net"]
    # a kernel that builds virtio in needs only the rest
    built_in = kernel.load_order(("virtio_net",), available, {"virtio", "virtio_ring"})
    assert built_in == ["failover", "net_failover", "virtio_net"]


def test_load_order_refuses_missing_and_circular_modules(tmp_path: Path) -> None:
    with pytest.raises(VmError, match="virtio_net is neither a module nor built in"):
        kernel.load_order(("virtio_net",), {}, set())
    loop = {"a": _module(tmp_path, "a", "b"), "b": _module(tmp_path, "b", "a")}
    with pytest.raises(VmError, match="depends on itself"):
        kernel.load_order(("a",), loop, set())


def _elf_with_note(note_type: int) -> bytes:
    name = b"Xen\0"
    note = struct.pack("<III", len(name), 4, note_type) + name + b"\0\0\0\0"
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5] = 2, 1  # 64-bit, little-endian
    struct.pack_into("<Q", header, 32, 64)  # e_phoff
    struct.pack_into("<HH", header, 54, 56, 1)  # e_phentsize, e_phnum
    phdr = struct.pack("<IIQQQQQQ", pvh.PT_NOTE, 0, 120, 0, 0, len(note), len(note), 4)
    return bytes(header) + phdr + note


def test_pvh_entry_is_recognised_only_with_xens_phys32_note() -> None:
    assert pvh.has_pvh_entry(_elf_with_note(pvh.XEN_ELFNOTE_PHYS32_ENTRY))
    assert not pvh.has_pvh_entry(_elf_with_note(pvh.XEN_ELFNOTE_PHYS32_ENTRY - 1))
    assert not pvh.has_pvh_entry(b"MZ not an elf" * 10)


def test_pvh_extract_finds_the_compressed_elf_inside_a_bzimage() -> None:
    elf = _elf_with_note(pvh.XEN_ELFNOTE_PHYS32_ENTRY)
    bzimage = b"setup code" * 100 + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"trailer"
    assert pvh.extract(bzimage) == elf
    assert pvh.extract(b"no payload here") is None


def test_manifests_round_trip_and_refuse_bad_values() -> None:
    record = KernelRecord(
        "linux-image-6.1.0-57-amd64",
        "6.1.192-3",
        "6.1.0-57-amd64",
        ("failover", "virtio_net"),
        True,
        ("virtio_net",),
    )
    assert parse_kernel(record.encode(), "kernel.json") == record
    manifest = ImageManifest(record, "1:1.35.0-4+deb12u1+b1", "ab" * 32)
    assert parse_manifest(manifest.encode(), "image.json") == manifest
    bad_module = KernelRecord(
        record.package, record.version, record.release, ("../x",), True, ("virtio_net",)
    )
    with pytest.raises(ValidationError, match="modules"):
        parse_kernel(bad_module.encode(), "kernel.json")
    with pytest.raises(ValidationError, match="pvh"):
        parse_kernel(
            b'{"v":1,"package":"linux-image-x","version":"1","release":"r","modules":[]}',
            "kernel.json",
        )
    with pytest.raises(ValidationError, match="inputs"):
        parse_manifest(manifest.encode().replace(b"ab" * 32, b"zz"), "image.json")
