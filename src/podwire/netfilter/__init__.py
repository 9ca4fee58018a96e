"""The only place podwire talks to netfilter (docs/security-groups.md): libnftables through
ctypes, and set element changes packed here into nf_tables netlink batches.

One buffer, or one batch, is one kernel transaction, so a ruleset change is applied whole or
not at all; no ``nft`` process is spawned per change.
"""

from podwire.netfilter.nft import Nftables, NftError, NftUnavailable

__all__ = ["NftError", "NftUnavailable", "Nftables"]
