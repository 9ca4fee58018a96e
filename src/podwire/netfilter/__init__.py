"""The only place podwire talks to netfilter: libnftables through ctypes (docs/security-groups.md).

One buffer is one kernel transaction, so a ruleset change is applied whole or not at all; no
``nft`` process is spawned per change.
"""

from podwire.netfilter.nft import Nftables, NftError, NftUnavailable

__all__ = ["NftError", "NftUnavailable", "Nftables"]
