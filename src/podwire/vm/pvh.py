"""The uncompressed kernel for PVH boot: QEMU enters it in 32-bit mode at its PVH entry point.

A bzImage starts in real mode and first decompresses itself (8 MB of xz into 65 MB); without
hardware virtualization that decompression alone costs TCG several seconds, about half of the
whole boot. Debian's kernel is built with ``CONFIG_PVH`` (its ELF carries the Xen
``PHYS32_ENTRY`` note), so the build unpacks the ELF once, and QEMU's ``-kernel`` loads it
directly (``-machine pc`` supports PVH for ELF kernels).
"""

from __future__ import annotations

import lzma
import struct
import zlib
from pathlib import Path

XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b\x08"
ELF_MAGIC = b"\x7fELF"
PT_NOTE = 4
XEN_ELFNOTE_PHYS32_ENTRY = 18


def extract(bzimage: bytes) -> bytes | None:
    """The ELF inside a bzImage, or None if its payload is in a format not handled here."""
    for magic, unpack in ((XZ_MAGIC, _unxz), (GZIP_MAGIC, _gunzip)):
        start = bzimage.find(magic)
        if start < 0:
            continue
        try:
            elf = unpack(bzimage[start:])
        except (lzma.LZMAError, zlib.error):
            continue
        if elf.startswith(ELF_MAGIC):
            return elf
    return None


def _unxz(data: bytes) -> bytes:
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)  # stops at its end


def _gunzip(data: bytes) -> bytes:
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)  # stops at its end


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF carries Xen's PHYS32_ENTRY note (PVH boot)."""
    if len(elf) < 64 or not elf.startswith(ELF_MAGIC) or elf[4] != 2 or elf[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 32)
    phentsize, phnum = struct.unpack_from("<HH", elf, 54)
    for index in range(phnum):
        kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", elf, phoff + index * phentsize)
        if kind == PT_NOTE and _notes_have_pvh(elf[offset : offset + size]):
            return True
    return False


def _notes_have_pvh(notes: bytes) -> bool:
    position = 0
    while position + 12 <= len(notes):
        name_size, desc_size, kind = struct.unpack_from("<III", notes, position)
        name = notes[position + 12 : position + 12 + name_size].rstrip(b"\0")
        if name == b"Xen" and kind == XEN_ELFNOTE_PHYS32_ENTRY:
            return True
        position += 12 + _aligned(name_size) + _aligned(desc_size)
    return False


def _aligned(size: int) -> int:
    return (size + 3) & ~3


def write_if_pvh(bzimage: Path, output: Path) -> bool:
    """Unpack ``bzimage``'s ELF to ``output`` if it can boot as PVH; False (and nothing
    written) otherwise, and the bzImage is booted instead."""
    elf = extract(bzimage.read_bytes())
    if elf is None or not has_pvh_entry(elf):
        return False
    output.write_bytes(elf)
    return True
