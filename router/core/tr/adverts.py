"""The proxy sources a portal advertises in its TRD (:class:`ProxyAdverts`) and
the transport bodies they carry (:func:`relay_transport`).

A proxy's TIR carries OtidOption(origin OTID), DomainIdOption(origin domain)
and CostOption(hop count, cost), ttl 60 (:data:`lbmr_proto.um.TIR_TTL`), and
the origin's topic index. It goes on UM's source timing (10 ms doubling to
500 ms for 5 s, then every 1 s for 60 s, then quiescent: answering TQRs
only). A removed proxy sends ``final_adverts`` final TIRs at the initial
advertisement gaps: the same TIR with CostOption(hop count, cost -1), the
"infinite cost = withdrawn" marker. Times are seconds on the portal's clock.

Late join and OTR: the origin's UME (0x01), late-join (0x04) and extended
functionality (0x0E) options cross the peer link
(:func:`origin_request_options`; the ADVERTISEMENT's ``tir_options``), and the
proxy's TIR carries them with the address that names the source's request
port (late-join and retransmission requests go there) replaced by the
router's request listener in this TRD, ``request_address`` of the settings,
and the transport index by the proxy's (:func:`proxy_request_options`;
:mod:`router.core.recovery`; the UME option loses its store address and
store flag: store traffic is not routed). Without a request listener the
options are left out (``tir_options_dropped_no_listener``): the TRD's
receivers never ask for late join at an address that cannot answer.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from lbmr_proto import (
    TIR,
    CostOption,
    DomainIdOption,
    ExFuncOption,
    LateJoinOption,
    LBMRDecodeError,
    LBMREncodeError,
    LbtruSessionTransport,
    LbtruTransport,
    OtidOption,
    TcpSessionTransport,
    TcpTransport,
    UmeOption,
)
from lbmr_proto.constants import Transport
from lbmr_proto.topts import decode_tir_options
from lbmr_proto.um import OTID_SIZE, TIR_TTL, Schedule, otid_topic_index

from ...peerlink import ADVERT_TIR_OPTION_TYPES
from ..recovery import proxy_transport_index
from .events import Addr, ProxySource
from .settings import PortalTRSettings
from .timers import ProxyTimer, TimerHeap

__all__ = ["ProxyAdverts", "relay_transport", "origin_request_options", "proxy_request_options"]

# the options that cross, and their fields (IPv4 address, port) that name the source's
# request port: where late-join and retransmission requests go
_REQUEST_FIELDS: dict[type, tuple[str, str]] = {
    UmeOption: ("src_tcp_addr", "src_tcp_port"),
    LateJoinOption: ("src_ip_addr", "src_tcp_port"),
    ExFuncOption: ("src_ip_addr", "src_tcp_port"),
}
_UME_STORE_FLAG = 0x2000  # UmeOption flags: stores are specified (by store options)
assert {c.CODE for c in _REQUEST_FIELDS} == set(ADVERT_TIR_OPTION_TYPES)


def origin_request_options(options: Iterable[object] | None, fill_ip: str | None = None) -> bytes:
    """What of an origin TIR's ``options`` (lbmr_proto option objects) crosses the peer
    link: its UME, late-join and extended-functionality options, the first of each kind,
    as on the wire (an ADVERTISEMENT's ``tir_options``; b"" if it has none). ``fill_ip``:
    put in place of a request address 0.0.0.0 (multicast TR, where no lbmrd fills in
    the sender's address)."""
    out: dict[type, bytes] = {}
    for o in options or ():
        fields = _REQUEST_FIELDS.get(type(o))
        if fields is None or type(o) in out:
            continue
        if fill_ip is not None and getattr(o, fields[0]) == "0.0.0.0":
            o = replace(o, **{fields[0]: fill_ip})
        out[type(o)] = o.encode()
    return b"".join(out.values())


def proxy_request_options(raw: bytes, request: Addr, transport_idx: int | None = None) -> list:
    """The options a proxy's TIR carries for the origin's ``raw`` options (an
    ADVERTISEMENT's ``tir_options``): each with its request address and port replaced by
    ``request`` (the router's request listener in the proxy's TRD) and, given
    ``transport_idx`` (the proxy's, :func:`router.core.recovery.proxy_transport_index`),
    the late-join and UME options' transport index replaced by it; the UME option
    without store (address, port and store flag cleared). ValueError for bytes that are
    not such options."""
    if not raw:
        return []
    try:
        opts, _ = decode_tir_options(struct.pack("!BBH", 0, 4, 4 + len(raw)) + raw, 0, 4 + len(raw))
    except (LBMRDecodeError, struct.error) as e:
        raise ValueError(f"bad origin TIR options: {e}") from None
    out = []
    for o in opts:
        fields = _REQUEST_FIELDS.get(type(o))
        if fields is None:
            raise ValueError(f"origin TIR option {o!r} does not cross")
        o = replace(o, **{fields[0]: request[0], fields[1]: request[1]})
        if transport_idx is not None and isinstance(o, UmeOption | LateJoinOption):
            o = replace(o, transport_idx=transport_idx)
        if isinstance(o, UmeOption):
            o = replace(o, flags=o.flags & ~_UME_STORE_FLAG, store_tcp_addr="0.0.0.0", store_tcp_port=0)
        out.append(o)
    return out


def relay_transport(code: int, ip: str, port: int, session_id: int | None = None):
    """The transport body of a proxy source relayed at ``ip``:``port``, for the
    LBMR transport ``code`` of the origin (as carried by an LBRP ADVERTISEMENT):
    TCP or LBT-RU, with a session id if one is given. ValueError otherwise."""
    if code == Transport.TCP:
        return TcpTransport(ip, port) if session_id is None else TcpSessionTransport(ip, session_id, port)
    if code == Transport.LBTRU:
        return LbtruTransport(ip, port) if session_id is None else LbtruSessionTransport(ip, session_id, port)
    raise ValueError(f"transport code 0x{code:02x} cannot be relayed (TCP and LBT-RU only)")


def _echo_key(otid: bytes, body) -> tuple[bytes, str, int]:
    return bytes(otid), getattr(body, "ip", None), getattr(body, "port", None)


class ProxyAdverts:
    """The proxies one portal advertises, by advert id, with those still sending
    final advertisements. Their timers wait in the portal's ``heap``; what
    happens is counted in ``stats`` (the portal's counters)."""

    __slots__ = ("_domain_id", "_timing", "_final_adverts", "_heap", "_st", "_proxies", "_finals",
                 "_topics", "_echoes", "_request_address")

    def __init__(self, settings: PortalTRSettings, heap: TimerHeap, stats: Counter[str]) -> None:
        self._domain_id = settings.domain_id
        self._request_address = settings.request_address
        self._timing = settings.timing
        self._final_adverts = settings.final_adverts
        self._heap = heap
        self._st = stats
        self._proxies: dict[int, ProxyTimer] = {}
        self._finals: dict[int, ProxyTimer] = {}
        self._topics: dict[str, dict[int, ProxyTimer]] = {}
        # our proxies' (OTID, relay ip, relay port): a TIR with all three is our own echo
        self._echoes: Counter[tuple[bytes, str, int]] = Counter()

    def __len__(self) -> int:
        return len(self._proxies)

    @property
    def topics(self) -> Mapping[str, Mapping[int, ProxyTimer]]:
        """Topic -> advert id -> proxy, of the proxies advertised (not those removed)."""
        return self._topics

    def specs(self) -> list[ProxySource]:
        return [p.spec for p in self._proxies.values()]

    def add(self, proxy: ProxySource, now: float) -> None:
        """As :meth:`router.core.tr.portal.PortalTR.add_proxy`."""
        if not isinstance(proxy.otid, bytes | bytearray) or len(proxy.otid) != OTID_SIZE:
            raise ValueError("proxy OTID must be 32 bytes")
        if proxy.origin_domain == self._domain_id:
            raise ValueError(f"proxy {proxy.topic!r} comes from this portal's own domain "
                             f"{self._domain_id} (a routing loop)")
        if not 0 < proxy.origin_domain <= 0xFFFFFFFF:
            raise ValueError(f"bad origin domain {proxy.origin_domain}")
        old = self._proxies.get(proxy.advert_id)
        if old is not None and old.spec == proxy:
            self._st["proxies_unchanged"] += 1
            return
        fin = self._finals.pop(proxy.advert_id, None)
        if fin is not None:
            fin.alive = False
        index = proxy.topic_index
        if index is None:
            index = otid_topic_index(proxy.otid) or 0
        opts = [OtidOption(0x8000, bytes(proxy.otid)), DomainIdOption(0x8000, proxy.origin_domain)]
        hops = max(1, min(255, proxy.hop_count))
        cost = max(0, min(2**31 - 1, proxy.cost))
        request_opts = []
        if proxy.tir_options:
            if self._request_address is None:
                self._st["tir_options_dropped_no_listener"] += 1
            else:
                request_opts = proxy_request_options(proxy.tir_options, self._request_address,
                                                     proxy_transport_index(proxy.advert_id))
                self._st["tir_options_substituted"] += 1
        opts += request_opts
        try:
            record = TIR(proxy.topic, proxy.transport_body, TIR_TTL, index,
                         opts + [CostOption(0, hops, cost)]).encode()
            final = TIR(proxy.topic, proxy.transport_body, TIR_TTL, index,
                        opts + [CostOption(0x80, hops, -1)]).encode()
        except (LBMREncodeError, AttributeError, struct.error) as e:
            raise ValueError(f"cannot advertise proxy {proxy!r}: {e}") from None
        if old is not None:
            self._unregister(old)
            old.alive = False
        p = ProxyTimer(proxy, record, final, Schedule(now, self._timing.ad_phase()))
        self._proxies[proxy.advert_id] = p
        self._topics.setdefault(proxy.topic, {})[proxy.advert_id] = p
        self._echoes[_echo_key(proxy.otid, proxy.transport_body)] += 1
        self._heap.arm(p)
        self._st["proxies_added"] += 1

    def remove(self, advert_id: int, now: float) -> ProxySource | None:
        """Stop advertising proxy ``advert_id`` (and answering for it); start its
        final advertisements. Returns the proxy removed (None: no such proxy)."""
        p = self._proxies.pop(advert_id, None)
        if p is None:
            return None
        self._unregister(p)
        self._st["proxies_removed"] += 1
        if self._final_adverts:
            p.removed = True
            p.record = p.final_record
            p.finals_left = self._final_adverts
            p.sched = Schedule(now, self._timing.ad_phase())
            self._finals[advert_id] = p
            self._heap.arm(p)
        else:
            p.alive = False
        return p.spec

    def fire(self, tm: ProxyTimer, now: float) -> bytes:
        """Proxy ``tm`` is due: the TIR to send now (its advertisement, or a final one)."""
        if tm.removed:
            self._st["final_adverts_sent"] += 1
            tm.finals_left -= 1
            if tm.finals_left <= 0:
                tm.alive = False
                if self._finals.get(tm.spec.advert_id) is tm:
                    del self._finals[tm.spec.advert_id]
                return tm.record
        else:
            self._st["adverts_sent"] += 1
        tm.sched.advance(now)
        return tm.record

    def is_echo(self, otid: bytes, *bodies) -> bool:
        """Is a TIR with ``otid`` and one of the transport ``bodies`` (the first
        one's port) one of our own proxies' advertisements?"""
        if not self._echoes:
            return False
        port = getattr(bodies[0], "port", None)
        return any(k in self._echoes
                   for k in [(bytes(otid), getattr(b, "ip", None), port) for b in bodies]
                   + [(bytes(otid), "0.0.0.0", port)])

    def _unregister(self, p: ProxyTimer) -> None:
        ps = self._topics.get(p.spec.topic)
        if ps is not None:
            ps.pop(p.spec.advert_id, None)
            if not ps:
                del self._topics[p.spec.topic]
        key = _echo_key(p.spec.otid, p.spec.transport_body)
        self._echoes[key] -= 1
        if self._echoes[key] <= 0:
            del self._echoes[key]
