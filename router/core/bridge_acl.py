"""How a bridge (:class:`router.core.bridge.Bridge`) applies its two ACLs, sans-IO:
the endpoint portal's and the peer portal's (:mod:`router.core.acl` decides),
a refusal counted, and noticed at the 1st, 2nd, 4th ... of a portal."""

from __future__ import annotations

from collections import Counter

from .acl import PortalAcl
from .bridge_outputs import BridgeOutput, Notice

__all__ = ["BridgeAcl"]


class BridgeAcl:
    """The ACLs a bridge applies: ``acl``, the endpoint portal's, and ``link_acl``, the
    peer portal's (``count_link_acl`` False: the link's refusals are counted by another
    bridge that gets the same frames). ``counters`` (the router's) counts each refusal as
    ``acl_rejected``; :attr:`rejected` counts them by portal name."""

    def __init__(self, acl: PortalAcl, link_acl: PortalAcl, count_link_acl: bool,
                 counters: Counter[str]) -> None:
        self.acl, self.link_acl, self.count_link_acl = acl, link_acl, count_link_acl
        self.counters = counters
        self.rejected: Counter[str] = Counter()  # refusals by portal name

    def allows(self, topic: str, what: str, count: bool, *verdicts: tuple[PortalAcl, bool],
               notices: list[BridgeOutput]) -> bool:
        """True if every (acl, allowed) verdict allows; else the refusal is counted
        (when ``count``) against the first ACL that refused, and an ``acl_rejected``
        :class:`Notice` appended to ``notices`` at the 1st, 2nd, 4th ... of a portal."""
        for acl, allowed in verdicts:
            if allowed:
                continue
            if count and (acl is self.acl or self.count_link_acl):
                self.counters["acl_rejected"] += 1
                self.rejected[acl.portal] += 1
                n = self.rejected[acl.portal]
                if n & (n - 1) == 0:
                    notices.append(Notice("acl_rejected", f"portal {acl.portal!r}: {what} {topic[:80]!r} "
                                          f"rejected by its ACL ({n} so far)"))
            return False
        return True
