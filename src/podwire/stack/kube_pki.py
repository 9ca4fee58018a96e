"""The local stack's Kubernetes PKI: one CA, the apiserver's serving cert, the components'
client certs and the service-account signing key pair, under ``DIR/kube/pki``.

Kubernetes authenticates its own components by client certificate (the subject's CN is the
user, each O a group), so the identities below are what RBAC's bootstrap policy expects. The
files outlive a stack run: a restarted stack keeps its CA, so kubeconfigs handed out and
service-account tokens already issued stay valid. A leaf is issued again only when it is
missing, near its end, or (the serving cert) lacks a name the apiserver is now reached by.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from podwire.errors import StackError
from podwire.files import atomic_write

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=30)
CLOCK_SKEW = datetime.timedelta(hours=1)

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Identity:
    """Who a client cert says it is: CN the user, ``groups`` its O entries."""

    name: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("podwire-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
# kube-apiserver's identity towards kubelets (exec, logs, port-forward): bound to the built-in
# system:kubelet-api-admin role once the apiserver is up, rather than made a system:masters.
KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client")
CLIENTS = {
    "admin": ADMIN,
    "kube-controller-manager": CONTROLLER_MANAGER,
    "kube-scheduler": SCHEDULER,
    "apiserver-kubelet-client": KUBELET_CLIENT,
}


@dataclass(frozen=True)
class KeyPair:
    """A cert (or public key) and its private key, as the files the components read."""

    cert: Path
    key: Path


class Pki:
    """The files of one stack's PKI; ``ensure`` creates what is missing or stale."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def pair(self, name: str) -> KeyPair:
        return KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")

    @property
    def ca(self) -> KeyPair:
        return self.pair("ca")

    @property
    def apiserver(self) -> KeyPair:
        return self.pair("apiserver")

    @property
    def service_accounts(self) -> KeyPair:
        """``cert`` is the public key (``sa.pub``) the apiserver verifies tokens with."""
        return KeyPair(self.directory / "sa.pub", self.directory / "sa.key")

    def ensure(self, hosts: Sequence[str]) -> None:
        """CA, serving cert for ``hosts`` (DNS names and IP addresses), client certs and the
        service-account keys."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        ca_key, ca_cert = self._ensure_ca()
        wanted = server_names(hosts)
        if needs_issue(self.apiserver.cert, wanted):
            self._issue(self.apiserver, ca_key, ca_cert, Identity("kube-apiserver"), wanted)
        for name, identity in CLIENTS.items():
            if needs_issue(self.pair(name).cert):
                self._issue(self.pair(name), ca_key, ca_cert, identity, None)
        if not self.service_accounts.key.exists():
            key = new_key()
            write_public_key(self.service_accounts.cert, key)
            write_key(self.service_accounts.key, key)

    def _ensure_ca(self) -> tuple[PrivateKey, x509.Certificate]:
        if self.ca.cert.exists() and self.ca.key.exists():
            return load_key(self.ca.key), load_cert(self.ca.cert)
        key = new_key()
        cert = make_ca(key, "podwire-stack-ca")
        write_key(self.ca.key, key)
        write_cert(self.ca.cert, cert)
        return key, cert

    def _issue(
        self,
        pair: KeyPair,
        ca_key: PrivateKey,
        ca_cert: x509.Certificate,
        identity: Identity,
        names: list[x509.GeneralName] | None,
    ) -> None:
        key = new_key()
        cert = issue(ca_key, ca_cert, identity, key.public_key(), names)
        write_key(pair.key, key)
        write_cert(pair.cert, cert)


def new_key() -> PrivateKey:
    """P-256: every Kubernetes component accepts it, and it is made in microseconds."""
    return ec.generate_private_key(ec.SECP256R1())


def _name(identity: Identity) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in identity.groups]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.name))
    return x509.Name(attributes)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - CLOCK_SKEW, now + datetime.timedelta(days=days)


def make_ca(key: PrivateKey, common_name: str) -> x509.Certificate:
    name = _name(Identity(common_name))
    start, end = _validity(CA_DAYS)
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def issue(
    ca_key: PrivateKey,
    ca_cert: x509.Certificate,
    identity: Identity,
    public_key: ec.EllipticCurvePublicKey,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A leaf signed by the CA: a serving cert when ``names`` are given, else a client cert."""
    start, end = _validity(LEAF_DAYS)
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    purpose = ExtendedKeyUsageOID.SERVER_AUTH if names else ExtendedKeyUsageOID.CLIENT_AUTH
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(identity))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(authority, critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def server_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """Each host as an IP address SAN if it parses as one, else as a DNS name."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def needs_issue(path: Path, names: list[x509.GeneralName] | None = None) -> bool:
    """Missing, unreadable, near its end, or lacking one of ``names``."""
    try:
        cert = load_cert(path)
    except StackError:
        return True
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) < RENEW_BEFORE:
        return True
    if not names:
        return False
    try:
        present = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    return not set(names) <= set(present)


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise StackError(f"{path}: not a readable certificate: {exc}") from exc


def load_key(path: Path) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise StackError(f"{path}: not a readable private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise StackError(f"{path}: expected an EC private key")
    return key


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_key(path: Path, key: PrivateKey) -> None:
    atomic_write(path, key_pem(key), 0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    atomic_write(path, cert_pem(cert), 0o644)


def write_public_key(path: Path, key: PrivateKey) -> None:
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    atomic_write(path, public, 0o644)
