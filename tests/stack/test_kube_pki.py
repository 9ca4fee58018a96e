"""The stack's Kubernetes PKI and kubeconfigs, and ``--kubernetes``'s refusals, without the
Kubernetes binaries: chains verify (also in a real TLS handshake), the serving cert names every
way the apiserver is reached, identities are what RBAC expects, a restart keeps what it can, and
a stack that cannot run Kubernetes says why before it starts anything."""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from podwire.errors import StackError
from podwire.stack import kube_control, kube_pki, kubeconfig
from podwire.stack.kube_pki import Pki, load_cert
from tests.conftest import PODWIRE

ADDRESS = "192.0.2.2"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    made = Pki(tmp_path / "pki")
    made.ensure(kube_control.server_hosts(ADDRESS))
    return made


def server_verifies(pki: Pki, name: x509.GeneralName) -> bool:
    store = Store([load_cert(pki.ca.cert)])
    verifier = PolicyBuilder().store(store).build_server_verifier(name)  # type: ignore[arg-type]
    try:
        verifier.verify(load_cert(pki.apiserver.cert), [])
    except x509.verification.VerificationError:
        return False
    return True


@pytest.mark.parametrize(
    "name",
    [
        x509.IPAddress(ipaddress.ip_address(ADDRESS)),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ],
)
def test_the_serving_cert_verifies_for_every_name_the_apiserver_is_reached_by(
    pki: Pki, name: x509.GeneralName
) -> None:
    assert server_verifies(pki, name)


def test_the_serving_cert_does_not_verify_for_another_address(pki: Pki) -> None:
    assert not server_verifies(pki, x509.IPAddress(ipaddress.ip_address("192.0.2.99")))


@pytest.mark.parametrize(
    ("name", "user", "groups"),
    [
        ("admin", "podwire-admin", ["system:masters"]),
        ("kube-controller-manager", "system:kube-controller-manager", []),
        ("kube-scheduler", "system:kube-scheduler", []),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []),
    ],
)
def test_client_certs_chain_to_the_ca_and_name_their_identity(
    pki: Pki, name: str, user: str, groups: list[str]
) -> None:
    cert = load_cert(pki.pair(name).cert)
    cert.verify_directly_issued_by(load_cert(pki.ca.cert))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [user]
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [a.value for a in orgs] == groups
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_tls_handshake_with_client_cert_succeeds_both_ways(pki: Pki) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(pki.apiserver.cert), str(pki.apiserver.key))
    server_ctx.load_verify_locations(str(pki.ca.cert))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    admin = pki.pair("admin")
    client_ctx.load_cert_chain(str(admin.cert), str(admin.key))
    seen: list[object] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen.append(tls.getpeercert())
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        port = listener.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(5)
    assert seen and "podwire-admin" in str(seen[0])


def test_the_service_account_key_pair_matches(pki: Pki) -> None:
    private = kube_pki.load_key(pki.service_accounts.key)
    public = serialization.load_pem_public_key(pki.service_accounts.cert.read_bytes())
    assert public.public_numbers() == private.public_key().public_numbers()  # type: ignore[union-attr]


def test_private_keys_are_for_the_owner_only(pki: Pki) -> None:
    assert stat.S_IMODE(pki.directory.stat().st_mode) == 0o700
    for key in pki.directory.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_a_second_ensure_changes_nothing(pki: Pki) -> None:
    before = {path.name: path.read_bytes() for path in pki.directory.iterdir()}
    pki.ensure(kube_control.server_hosts(ADDRESS))
    assert {path.name: path.read_bytes() for path in pki.directory.iterdir()} == before


def test_a_new_address_reissues_only_the_serving_cert(pki: Pki) -> None:
    before = {path.name: path.read_bytes() for path in pki.directory.iterdir()}
    pki.ensure(kube_control.server_hosts("192.0.2.3"))
    after = {path.name: path.read_bytes() for path in pki.directory.iterdir()}
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"apiserver.crt", "apiserver.key"}
    assert server_verifies(pki, x509.IPAddress(ipaddress.ip_address("192.0.2.3")))


def test_a_kubeconfig_embeds_the_ca_and_the_identity(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "admin.kubeconfig"
    kubeconfig.write(path, "https://192.0.2.2:6443", pki.ca.cert, pki.pair("admin"), "admin")
    config = json.loads(path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://192.0.2.2:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == pki.ca.cert.read_bytes()
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-key-data"]) == pki.pair("admin").key.read_bytes()
    assert config["current-context"] == config["contexts"][0]["name"] == "admin"


def test_missing_binaries_are_named_with_the_way_to_build_them(tmp_path: Path) -> None:
    (tmp_path / "kubectl").write_text("")
    with pytest.raises(StackError, match=r"missing: kube-apiserver.*run scripts/setup"):
        kube_control.check_binaries(tmp_path)


def test_the_advertised_address_is_not_loopback() -> None:
    assert not ipaddress.ip_address(kube_control.advertise_address()).is_loopback


def stack_up(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODWIRE, "stack", "up", *args], capture_output=True, text=True, timeout=120
    )


def test_missing_binaries_are_refused_before_anything_starts(tmp_path: Path) -> None:
    data_dir = tmp_path / "s"
    done = stack_up("--data-dir", str(data_dir), "--kubernetes",
               "--kube-bin-dir", str(tmp_path / "nowhere"))  # fmt: skip
    assert done.returncode == 2
    assert "run scripts/setup" in done.stderr and "Traceback" not in done.stderr
    assert not (data_dir / "etcd").exists()


def test_kubernetes_with_etcd_auth_is_refused(tmp_path: Path) -> None:
    done = stack_up("--data-dir", str(tmp_path / "s"), "--kubernetes", "--etcd-auth")
    assert done.returncode == 2
    assert "--etcd-auth" in done.stderr and "Traceback" not in done.stderr
