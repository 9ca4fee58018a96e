"""The etcd client against the real etcd server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from podwire.config import EtcdSettings
from podwire.errors import ConfigError, EtcdUnavailable
from podwire.etcd import client as client_module
from podwire.etcd.client import EtcdClient, key_exists, put_op
from podwire.stack.etcd_server import EtcdServer
from podwire.stack.netutil import free_port

from .conftest import PrivateEtcd


async def test_put_get_delete(etcd: EtcdClient, prefix: str) -> None:
    revision = await etcd.put(prefix + "a", b"1")
    kv = await etcd.get(prefix + "a")
    assert kv is not None
    assert (kv.value, kv.mod_revision, kv.version) == (b"1", revision, 1)
    assert await etcd.delete(prefix + "a") is True
    assert await etcd.get(prefix + "a") is None
    assert await etcd.delete(prefix + "a") is False


async def test_get_prefix_pages_at_one_revision(
    etcd: EtcdClient, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "PAGE_SIZE", 7)
    for index in range(30):
        await etcd.put(f"{prefix}k{index:02d}", str(index).encode())
    await etcd.put(prefix.rstrip("/") + "-sibling", b"outside")
    items, revision = await etcd.get_prefix(prefix)
    assert [kv.key for kv in items] == [f"{prefix}k{i:02d}" for i in range(30)]
    assert revision >= max(kv.mod_revision for kv in items)
    await etcd.delete(prefix.rstrip("/") + "-sibling")


async def test_create_if_absent_only_once(etcd: EtcdClient, prefix: str) -> None:
    results = await asyncio.gather(*(etcd.create_if_absent(prefix + "x", b"v") for _ in range(10)))
    assert results.count(True) == 1


async def test_txn_guard(etcd: EtcdClient, prefix: str) -> None:
    ok, _ = await etcd.txn([key_exists(prefix + "leader")], [put_op(prefix + "data", b"x")])
    assert not ok
    assert await etcd.get(prefix + "data") is None
    await etcd.put(prefix + "leader", b"me")
    ok, _ = await etcd.txn([key_exists(prefix + "leader")], [put_op(prefix + "data", b"x")])
    assert ok


async def test_lease_keepalive_keeps_key_and_revoke_removes_it(
    etcd: EtcdClient, prefix: str
) -> None:
    lease = await etcd.grant_lease(2)
    await etcd.put(prefix + "alive", b"1", lease=lease.id)
    keeper = asyncio.create_task(lease.keepalive())
    await asyncio.sleep(3.5)
    assert await etcd.get(prefix + "alive") is not None
    keeper.cancel()
    await lease.revoke()
    assert await etcd.get(prefix + "alive") is None


async def test_lease_without_keepalive_expires(etcd: EtcdClient, prefix: str) -> None:
    lease = await etcd.grant_lease(1)
    await etcd.put(prefix + "ephemeral", b"1", lease=lease.id)
    for _ in range(60):
        if await etcd.get(prefix + "ephemeral") is None:
            break
        await asyncio.sleep(0.1)
    assert await etcd.get(prefix + "ephemeral") is None
    assert await etcd.refresh_lease(lease.id) == 0


async def test_unreachable_etcd_is_retryable_with_clear_message() -> None:
    settings = EtcdSettings(endpoints=[f"http://127.0.0.1:{free_port()}"], timeout=0.5)
    with pytest.raises(EtcdUnavailable, match="etcd status"):
        await EtcdClient.connect(settings)


async def test_several_endpoints_fail_over(etcd_settings: EtcdSettings) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = EtcdSettings(endpoints=[dead, *etcd_settings.endpoints], timeout=3)
    async with await EtcdClient.connect(settings) as client:
        assert await client.status() > 0


def test_several_endpoints_get_a_channel_each() -> None:
    # One channel per member (the client fails over itself), so names are fine too.
    targets = client_module._channel_targets(["http://localhost:1", "http://10.0.0.2:2"])
    assert targets == (["localhost:1", "10.0.0.2:2"], False)
    with pytest.raises(ConfigError, match="mix of http and https"):
        client_module._channel_targets(["http://a:1", "https://b:2"])


async def test_missing_tls_file_names_key() -> None:
    settings = EtcdSettings(endpoints=["https://127.0.0.1:1"], ca_file="/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match=r"etcd.ca_file: cannot read /nonexistent/ca.pem"):
        await EtcdClient.connect(settings)


def make_tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, written as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "podwire-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.mark.stack  # starts a TLS etcd of its own
async def test_tls_endpoint_with_ca_file(tmp_path: Path) -> None:
    ca, cert, key = make_tls_files(tmp_path)
    server = EtcdServer(
        tmp_path / "etcd", free_port(), free_port(), cert_file=str(cert), key_file=str(key)
    )
    etcd = PrivateEtcd(server, tmp_path / "etcd.log")
    etcd.start()
    try:
        settings = EtcdSettings(endpoints=[server.client_url], ca_file=str(ca), timeout=3)
        async with await EtcdClient.connect(settings) as client:
            await client.put("/tls/key", b"secret")
            kv = await client.get("/tls/key")
            assert kv is not None and kv.value == b"secret"
        plain = EtcdSettings(endpoints=[f"http://127.0.0.1:{server.client_port}"], timeout=1)
        with pytest.raises(EtcdUnavailable):
            await EtcdClient.connect(plain)
    finally:
        etcd.stop()
