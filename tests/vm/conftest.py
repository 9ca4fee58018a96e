"""Fixtures of the VM suite: the image (built by scripts/setup), short run dirs, a LAN."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podwire.stack import procs
from podwire.vm import image, launcher
from tests.agent.netenv import NetEnv
from tests.vm import lan as lans


@pytest.fixture(scope="session")
def vm_image() -> image.Image:
    if image.find() is None and shutil.which(launcher.QEMU):
        image.build(image.default_dir())  # scripts/setup builds it; a bare checkout here, once
    reason = launcher.unavailable()
    if reason:
        pytest.skip(reason)
    return image.load()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 characters: tmp_path's can be longer."""
    path = Path(tempfile.mkdtemp(prefix="pwvm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def vms() -> Iterator[list[launcher.Vm]]:
    """VMs a test started; each is killed afterwards (its tap goes with it)."""
    started: list[launcher.Vm] = []
    yield started
    for vm in started:
        vm.kill()


@pytest.fixture
def lan(netenv: NetEnv) -> lans.Lan:
    return lans.build(netenv)


@pytest.fixture
def mac() -> str:
    return "fa:16:3e:" + ":".join(uuid.uuid4().hex[i : i + 2] for i in (0, 2, 4))


@pytest.fixture
def port_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def dnsmasq(lan: lans.Lan, short_dir: Path, mac: str) -> Iterator[Path]:
    """A real dnsmasq on the LAN that gives ``mac`` the address lans.VM_ADDRESS; yields its
    work dir (``leases``, ``dnsmasq.log``)."""
    work = short_dir / "dnsmasq"
    work.mkdir()
    proc = lans.start_dnsmasq(lan, work, {mac: lans.VM_ADDRESS})
    yield work
    procs.stop_child(proc)
