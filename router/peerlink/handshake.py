"""The handshake's acceptance rules (``router/PEERLINK.md``, Handshake): what
either side checks of the peer's identity before the link comes up, in order,
the first failure deciding. Pure: the peer's announced identity in, a
:class:`~router.peerlink.wire.ConnectCode` and a reason out."""

from __future__ import annotations

from collections.abc import Callable

from .events import PeerInfo, RouterIdentity
from .wire import PROTOCOL_VERSION, ConnectCode

__all__ = ["judge_peer", "version_reason"]


def judge_peer(me: RouterIdentity, peer: PeerInfo,
               accept: Callable[[PeerInfo], tuple[bool, str]] | None = None) -> tuple[int, str]:
    """(code, reason) for ``peer`` as seen by ``me``: the built-in checks (major
    version, name, domain ids, a shared domain, the same name), then ``accept``
    (local policy; an exception in it refuses). ``ConnectCode.ACCEPTED, ""`` when
    all pass."""
    if peer.version[0] != PROTOCOL_VERSION[0]:
        return ConnectCode.VERSION_MISMATCH, version_reason(*peer.version)
    if not peer.name:
        return ConnectCode.BAD_REQUEST, "the peer sent an empty router name"
    if 0 in peer.domains:
        return ConnectCode.BAD_REQUEST, f"router {peer.name!r} announces domain id 0 (invalid)"
    if len(set(peer.domains)) != len(peer.domains):
        return ConnectCode.BAD_REQUEST, f"router {peer.name!r} announces a domain id twice"
    shared = sorted(set(peer.domains) & set(me.domains))
    if shared:
        return ConnectCode.DOMAIN_CONFLICT, (
            f"domain id{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))} "
            f"served by both {me.name!r} and {peer.name!r}: each TRD must be "
            "behind one side of a peer link")
    if peer.name == me.name:
        return ConnectCode.DUPLICATE_NAME, (
            f"both routers are named {peer.name!r} (or the router connected to itself)")
    if accept is not None:
        try:
            ok, reason = accept(peer)
        except Exception as e:  # a broken callback must not break the receive path
            return ConnectCode.REFUSED, f"acceptance check failed: {e!r}"
        if not ok:
            return ConnectCode.REFUSED, reason or "refused by local policy"
    return ConnectCode.ACCEPTED, ""


def version_reason(major: int, minor: int) -> str:
    """Why a peer of protocol ``major``.``minor`` is refused (a major version other than ours)."""
    me = f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}"
    rel = "higher" if major > PROTOCOL_VERSION[0] else "lower"
    return (f"the peer speaks protocol {major}.{minor}, this router speaks {me}: "
            f"a {rel} major version is not supported")
