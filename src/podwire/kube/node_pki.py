"""A node's kubelet certificates, issued by the local stack's CA (``DIR/kube/pki``).

The client cert makes kubelet the user ``system:node:HOST`` in the group ``system:nodes``: the
apiserver's Node authorizer and NodeRestriction admission then let it act for that node only.
The serving cert is what kubelet presents to the apiserver (exec, logs) for its address and
name. Both are issued again only when missing, near their end or (serving) for another address.
"""

from __future__ import annotations

from pathlib import Path

from podwire.stack import kube_pki
from podwire.stack.kube_pki import Identity, KeyPair, Pki

NODES_GROUP = "system:nodes"


def node_identity(host: str) -> Identity:
    return Identity(f"system:node:{host}", (NODES_GROUP,))


def client_pair(directory: Path) -> KeyPair:
    return KeyPair(directory / "kubelet-client.crt", directory / "kubelet-client.key")


def serving_pair(directory: Path) -> KeyPair:
    return KeyPair(directory / "kubelet-server.crt", directory / "kubelet-server.key")


def ensure(stack_pki: Pki, directory: Path, host: str, node_ip: str) -> None:
    """kubelet's client and serving certs in ``directory``, signed by the stack's CA."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key = kube_pki.load_key(stack_pki.ca.key)
    ca_cert = kube_pki.load_cert(stack_pki.ca.cert)
    identity = node_identity(host)
    wanted = {
        client_pair(directory): None,
        serving_pair(directory): kube_pki.server_names([node_ip, host]),
    }
    for pair, names in wanted.items():
        if kube_pki.needs_issue(pair.cert, names) or not pair.key.exists():
            key = kube_pki.new_key()
            cert = kube_pki.issue(ca_key, ca_cert, identity, key.public_key(), names)
            kube_pki.write_key(pair.key, key)
            kube_pki.write_cert(pair.cert, cert)
