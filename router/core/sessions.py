"""Source transport sessions across a peer link, sans-IO.

UM puts many topics on one transport session (a TCP or LBT-RU source address
and port): a receiver context connects to the session once and gets every
topic it carries, each message tagged with its topic index. The DRO likewise
serves the topics of one session through one proxy session. So does the
router: the far side names each advertisement's session
(:func:`session_key`, the ADVERTISEMENT's ``session`` field, capability
SESSIONS) and the near side (:class:`ProxySessions`) runs one proxy listener
per session, whose relay address every topic of the session advertises (each
with its own topic index, from its OTID). Ten thousand topics from a thousand
sessions take a thousand listeners, not ten thousand, and a receiver context
takes one relayed stream per session.

LBT-RM sources are not grouped: each has a proxy of its own (its group,
port and session id are the proxy's).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from lbmr_proto import TQR, LBMREncodeError
from lbmr_proto.records import Transport

from .. import peerlink as P

__all__ = ["session_key", "ProxySession", "ProxySessions"]

# keyed per process: the peer cannot make two of our sessions collide, nor learn
# the source addresses from the numbers
_KEY = secrets.token_bytes(16)
_GROUPED = (Transport.TCP, Transport.LBTRU)


def session_key(body) -> int:
    """A 64-bit name, never 0, for the transport session of a TIR transport body
    (type, address, port and session id: two topics of one session get the same
    name, two sessions a different one with probability 1 - 2**-64); 0 for a
    transport whose topics are not grouped (LBT-RM, unknown)."""
    if getattr(body, "TYPE", None) not in _GROUPED:
        return 0
    ident = f"{int(body.TYPE)}/{body.ip}/{body.port}/{getattr(body, 'session_id', '-')}".encode()
    k = int.from_bytes(hashlib.blake2b(ident, digest_size=8, key=_KEY).digest(), "big")
    return k or 1


def carried(topic: str) -> bool:
    """Can a TIR (a TQR) carry ``topic``? UM's names: at most 255 bytes, no NUL."""
    try:
        TQR(topic).encode()
    except LBMREncodeError:
        return False
    return True


@dataclass(slots=True, eq=False)
class ProxySession:
    """One proxy listener (``proxy_id``: the advert id it was started for) and
    the peer's advertisements it serves, by advert id, oldest first.
    ``address`` and ``body`` (its relay address and the transport body its
    topics advertise) are set once the listener is bound; ``pending`` holds
    the advertisements not yet advertised at it (a session of thousands of
    topics is advertised a chunk at a time, the event loop running between)."""

    proxy_id: int
    transport: int
    adverts: dict[int, P.Advertisement] = field(default_factory=dict)
    address: tuple[str, int] | None = None
    body: object = None
    pending: dict[int, P.Advertisement] = field(default_factory=dict)


class ProxySessions:
    """The near side's proxies grouped by the peer's transport sessions (one
    peer link). An advertisement with a session joins the proxy of the other
    advertisements with the same transport and session; one without (or
    LBT-RM) gets a proxy of its own."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, int, int], ProxySession] = {}
        self._of_advert: dict[int, ProxySession] = {}
        self._by_proxy: dict[int, ProxySession] = {}

    @staticmethod
    def _key(f: P.Advertisement) -> tuple[int, int, int]:
        if f.session and f.transport in _GROUPED:
            return (f.transport, f.session, 0)
        return (f.transport, 0, f.advert_id)

    def __len__(self) -> int:
        """Proxy listeners (sessions)."""
        return len(self._by_proxy)

    def __contains__(self, advert_id: int) -> bool:
        return advert_id in self._of_advert

    def adverts(self) -> int:
        """Advertisements served."""
        return len(self._of_advert)

    def find(self, f: P.Advertisement) -> ProxySession | None:
        """The proxy that serves (or would serve) ``f``'s session, if it runs."""
        return self._by_key.get(self._key(f))

    def add(self, f: P.Advertisement) -> tuple[ProxySession, bool] | None:
        """Serve ``f``: with the proxy of its session, or a new one (True) named by
        ``f``'s advert id. None if that name is taken by a proxy that still runs
        (an advert id the peer used before, withdrawn, while its session lives:
        the far side numbers advertisements afresh, so only a broken peer does),
        or if no TIR can carry ``f``'s topic (over 255 bytes, a NUL byte: only a
        broken or hostile peer sends one; proxied, its TIR could not be built)."""
        if not carried(f.topic):
            return None
        key = self._key(f)
        ps = self._by_key.get(key)
        new = ps is None
        if new:
            if f.advert_id in self._by_proxy:
                return None
            ps = self._by_key[key] = self._by_proxy[f.advert_id] = ProxySession(f.advert_id, f.transport)
        ps.adverts[f.advert_id] = f
        self._of_advert[f.advert_id] = ps
        return ps, new

    def remove(self, advert_id: int) -> tuple[ProxySession, P.Advertisement, bool] | None:
        """Stop serving ``advert_id``: its proxy, the advertisement, and whether
        the proxy serves nothing more (it is forgotten then). None if unknown."""
        ps = self._of_advert.pop(advert_id, None)
        if ps is None:
            return None
        f = ps.adverts.pop(advert_id)
        ps.pending.pop(advert_id, None)
        if ps.adverts:
            return ps, f, False
        del self._by_proxy[ps.proxy_id]
        del self._by_key[self._key(f)]  # every advertisement of a proxy has its key
        return ps, f, True

    def proxy(self, proxy_id: int) -> ProxySession | None:
        return self._by_proxy.get(proxy_id)

    def advert(self, advert_id: int) -> P.Advertisement | None:
        """The peer's advertisement ``advert_id`` if it is served here."""
        ps = self._of_advert.get(advert_id)
        return None if ps is None else ps.adverts.get(advert_id)

    def advert_of(self, proxy_id: int) -> int | None:
        """A live advertisement of proxy ``proxy_id`` (the oldest): what a stream
        for one of its receivers names on the link. None if it serves none."""
        ps = self._by_proxy.get(proxy_id)
        return next(iter(ps.adverts), None) if ps is not None else None

    def sessions(self) -> list[ProxySession]:
        return list(self._by_proxy.values())


class SourceAdverts:
    """The far side's advertisements (one peer link): advert id by (topic, OTID)
    of a source of our TRD, the source's transport body by advert id, and the
    advert ids of each transport session (:func:`session_key`), so that what a
    relayed session tells about its source (it ended) applies to every topic
    of the session."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, bytes], int] = {}
        self._key: dict[int, tuple[str, bytes]] = {}
        self._body: dict[int, object] = {}
        self._session: dict[int, int] = {}  # advert id -> session name (0: not grouped)
        self._by_session: dict[int, set[int]] = {}
        self._options: dict[int, bytes] = {}  # advert id -> the source TIR's request options

    def __contains__(self, key: tuple[str, bytes]) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def keys(self) -> list[tuple[str, bytes]]:
        return list(self._ids)

    def get(self, key: tuple[str, bytes]) -> int | None:
        return self._ids.get(key)

    def set(self, key: tuple[str, bytes], advert_id: int, body, tir_options: bytes = b"") -> int:
        """Advert ``advert_id`` is ``key``'s, its source at ``body`` (which may
        have changed; ``tir_options``: its TIR's UME, late-join and exfunc options, as
        the advertisement carries them); its session name."""
        self._unsession(advert_id)
        self._options[advert_id] = tir_options
        self._ids[key] = advert_id
        self._key[advert_id] = key
        self._body[advert_id] = body
        s = self._session[advert_id] = session_key(body)
        if s:
            self._by_session.setdefault(s, set()).add(advert_id)
        return s

    def pop(self, key: tuple[str, bytes]) -> tuple[int, object] | None:
        """Forget ``key``'s advertisement: (its advert id, its body), or None."""
        aid = self._ids.pop(key, None)
        if aid is None:
            return None
        self._unsession(aid)
        self._session.pop(aid, None)
        self._options.pop(aid, None)
        del self._key[aid]
        return aid, self._body.pop(aid)

    def _unsession(self, advert_id: int) -> None:
        s = self._session.get(advert_id)
        if s:
            group = self._by_session[s]
            group.discard(advert_id)
            if not group:
                del self._by_session[s]

    def clear(self) -> None:
        for d in (self._ids, self._key, self._body, self._session, self._by_session, self._options):
            d.clear()

    def body(self, advert_id: int):
        return self._body.get(advert_id)

    def tir_options(self, advert_id: int) -> bytes:
        """The request options (UME, late join, exfunc) of the source behind ``advert_id``."""
        return self._options.get(advert_id, b"")

    def bodies(self) -> dict[int, object]:
        return dict(self._body)

    def key(self, advert_id: int) -> tuple[str, bytes] | None:
        return self._key.get(advert_id)

    def session_name(self, advert_id: int) -> tuple[int, int] | None:
        """A name for ``advert_id``'s transport session that outlives the advert id:
        (session, 0), or (0, advert_id) for an ungrouped transport; None if unknown."""
        s = self._session.get(advert_id)
        if s is None:
            return None
        return (s, 0) if s else (0, advert_id)

    def adverts_named(self, name: tuple[int, int]) -> list[int]:
        """The advert ids of the session :meth:`session_name` called ``name`` now."""
        if name[0]:
            return sorted(self._by_session.get(name[0], ()))
        return [name[1]] if name[1] in self._key else []
