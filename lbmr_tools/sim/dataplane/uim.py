"""A simulated context's request port: the TCP listener that takes unicast
immediate messages (UIMs) from other contexts -- responses to its sources'
requests, and the late-join and OTR answers its receivers asked for (see
:mod:`lbmr_tools.sim.dataplane` and lbmr-sim(1), REQUESTS, LATE JOIN AND OTR).

UM's way, as lbmr-sim models it:

* a request is a data message of the source's live stream with a REQUEST
  header (:class:`lbmr_proto.lbmc.RequestHeader`) naming the requester's
  request port (``ipaddr``, ``port``, transport 0: TCP) and the request
  index ``qidx``; a receiver that responds connects to that address (one
  connection per requester, kept) and sends the response there;
* a source that offers late join names its context's request port in its
  TIR (late-join option 0x04: ``src_ip``/``src_tcp_port`` and its
  ``transport_idx``; extended-functionality option 0x0E); a receiver sends
  its late-join request (LJI_REQ) and OTR requests (UME_RXREQ) there, as
  UIMs over a TCP connection of its own (never upstream on the data
  connection), naming the source's ``transport_idx`` and topic index and the
  receiver's own request port (``req_ip``/``req_port``,
  ``rx_ip``/``rx_port``); the source connects there and sends a CONTROL
  message with UME_LJ_INFO (the retained range, the request's index as
  ``qidx``; late join only) and the retained messages as RETRANS.

Public material does not show which header, if any, marks a response; the
simulator sends it as a plain MESSAGE whose topic index is the request
index and whose payload is ``RESPONSE_SIZE`` bytes of the requester's
response stream at that index (:func:`response_message`), so every response
can be checked on its own. Wireshark's lbmc dissector shows it as DATA.

:class:`RequestPort` only moves bytes and sorts messages: responses are
counted per request index (with the payload check), UME_LJ_INFO goes to the
receiver that owns its index, RETRANS to every receiver registered for the
sending address and topic index, LJI_REQ and UME_RXREQ to the source of the
context with the transport index they name (through bounded trio channels).
"""

from __future__ import annotations

import bisect
import socket
from dataclasses import asdict, dataclass, field

import trio

from lbmr_proto import lbmc

from .live import message_payload, open_tcp_listener
from .pattern import topic_seed

Addr = tuple[str, int]

RESPONSE_SIZE = 64  # payload bytes of a response
RESPONSE_KEY = b"\0lbmr-sim/response"
UIM_SIZE = 64  # payload bytes of a UIM sent by domain
UIM_KEY = b"\0lbmr-sim/uim"
REQUEST_INDEXES = 1 << 16  # request indexes a receiver may use (late join, OTR)
RECEIVER_INDEX_BASE = 1 << 31  # receivers' request indexes: from here, a block of REQUEST_INDEXES each
MAX_REGISTRATIONS = (1 << 31) // REQUEST_INDEXES  # receivers registered with one port at once


def response_seed(seed: int) -> int:
    """The key of the response stream of a request stream keyed by ``seed``."""
    return topic_seed(RESPONSE_KEY, seed)


def response_payload(seed: int, qidx: int, size: int = RESPONSE_SIZE) -> bytes:
    return bytes(message_payload(response_seed(seed), qidx, size))


def response_message(seed: int, qidx: int, size: int = RESPONSE_SIZE) -> bytes:
    """A response UIM to request ``qidx`` of the requester keyed by ``seed``:
    a MESSAGE with topic index ``qidx``, sequence 0, no headers."""
    return lbmc.data_message(qidx & 0xFFFFFFFF, 0, response_payload(seed, qidx, size))


def uim_payload(seq: int, size: int = UIM_SIZE) -> bytes:
    return bytes(message_payload(topic_seed(UIM_KEY, 0), seq, size))


def uim_by_domain(seq: int, dest: tuple[int, str, int], orig: tuple[int, str, int],
                  size: int = UIM_SIZE) -> bytes:
    """UIM number ``seq`` addressed ``TCP:domain:ip:port`` (``dest``) from ``orig``
    (the sender's domain, address and request port): a MESSAGE with a DESTINATION
    header (``hops_taken`` 0), sequence number ``seq`` and ``size`` payload bytes of
    the simulator's UIM stream at ``seq``."""
    d = lbmc.DestinationHeader(0, dest[0], dest[1], dest[2], 0, orig[0], orig[1], orig[2])
    return lbmc.data_message(0, seq & 0xFFFFFFFF, uim_payload(seq, size), d)


def parse_uim_address(text: str) -> tuple[int, str, int]:
    """UM's ``TCP:domain:ip:port`` -> (domain, ip, port); ValueError otherwise."""
    parts = text.split(":")
    if len(parts) != 4 or parts[0].upper() != "TCP" or not parts[1].isdigit() or not parts[3].isdigit():
        raise ValueError(f"expected TCP:DOMAIN:IP:PORT, got {text!r}")
    domain, port = int(parts[1]), int(parts[3])
    if not 0 < domain <= 0xFFFFFFFF or not 0 < port <= 0xFFFF:
        raise ValueError(f"domain id (1..2**32-1) or port (1..65535) out of range in {text!r}")
    try:
        socket.inet_aton(parts[2])
    except OSError:
        raise ValueError(f"not an IPv4 address in {text!r}") from None
    if parts[2].count(".") != 3:
        raise ValueError(f"not a dotted-quad IPv4 address in {text!r}")
    return domain, parts[2], port


@dataclass
class UimSendReport:
    """Context 0's UIMs by domain: ``to`` (TCP:domain:ip:port), the router listener
    it sent them through (``via``), when it heard the route (``route_after_s``, from
    the start of the run), how many went (``sent``), and why not all (``error``)."""

    to: str
    count: int
    via: str | None = None
    route_after_s: float | None = None
    sent: int = 0
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


async def send_by_domain(report: UimSendReport, via: Addr, bind_ip: str | None, dest: tuple[int, str, int],
                         orig: tuple[int, str, int], timeout: float) -> None:
    """Send ``report.count`` UIMs to ``dest`` through the router listener ``via``, on one
    connection from ``bind_ip``, within ``timeout`` seconds; counted in ``report``."""
    report.via = f"{via[0]}:{via[1]}"
    with trio.move_on_after(timeout) as scope:
        try:
            stream = await connect_from(bind_ip, via)
            async with stream:
                for seq in range(report.count):
                    await stream.send_all(uim_by_domain(seq, dest, orig))
                    report.sent += 1
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            report.error = f"{via[0]}:{via[1]}: {e}"
    if scope.cancelled_caught:
        report.error = f"not sent within {timeout} s"


def request_header(qidx: int, ip: str, port: int) -> lbmc.RequestHeader:
    """The REQUEST header of request ``qidx`` answered at (``ip``, ``port``) over TCP."""
    return lbmc.RequestHeader(0, 0, qidx, port, 0, ip)


@dataclass
class RequestStats:
    """A requesting source's requests: indexes ``first_qidx`` to
    ``first_qidx + count - 1``; ``responses`` counts the good responses per
    index, ``bad_payloads`` those whose payload was not the index's."""

    topic: str
    first_qidx: int
    count: int
    seed: int = field(repr=False, default=0)
    responses: dict[int, int] = field(default_factory=dict)
    bad_payloads: int = 0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("seed")
        d["responses"] = {str(q): n for q, n in sorted(self.responses.items())}
        return d


@dataclass
class PortStats:
    connections: int = 0
    refused: int = 0  # beyond max_connections
    messages: int = 0
    responses: int = 0
    unknown_qidx: int = 0  # responses and UME_LJ_INFO for no request of ours
    retransmissions: int = 0
    unclaimed: int = 0  # RETRANS no receiver registered for
    recovery_requests: int = 0  # LJI_REQ and UME_RXREQ for one of our sources
    unknown_transport: int = 0  # LJI_REQ and UME_RXREQ naming no source of ours
    overflow: int = 0  # messages for a receiver whose channel was full
    malformed: int = 0
    other: int = 0
    idle_closed: int = 0
    uims: int = 0  # UIMs addressed by domain (a DESTINATION header) with the simulator's payload
    uims_bad: int = 0  # ... with another payload
    uim_hops: dict[str, int] = field(default_factory=dict)  # their hops_taken (routers crossed): count


class _Registration:
    __slots__ = ("first_idx", "source", "tidx", "send")

    def __init__(self, first_idx: int, source: str, tidx: int, send) -> None:
        self.first_idx, self.source, self.tidx, self.send = first_idx, source, tidx, send


class RequestPort:
    """A context's request port: a TCP listener on (``bind_ip``, ``port``)
    (0: the kernel's choice) taking LBMC messages from other contexts.

    Sources get request-index ranges with :meth:`add_requests`; receivers
    register with :meth:`register` and receive, on a bounded channel, the
    UME_LJ_INFO messages for their indexes and the RETRANS messages of the
    (source address, topic index) they receive. At most ``max_connections``
    connections at once; one silent for ``idle_timeout`` seconds is closed;
    a malformed message closes its connection.
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, max_connections: int = 256,
                 idle_timeout: float = 30.0, channel_size: int = 65536, backlog: int = 128) -> None:
        if max_connections < 1 or not idle_timeout > 0 or channel_size < 1:
            raise ValueError("max_connections, idle_timeout and channel_size must be positive")
        self.bind_ip, self.port, self.backlog = bind_ip, port, backlog
        self.max_connections, self.idle_timeout, self.channel_size = max_connections, idle_timeout, channel_size
        self.address: Addr | None = None
        self.stats = PortStats()
        self.requests: list[RequestStats] = []
        self._next_qidx = 0  # sources' request indexes: 0 up (u32: below RECEIVER_INDEX_BASE)
        self._free_blocks: list[int] = []  # receivers' index blocks given back
        self._next_block = RECEIVER_INDEX_BASE
        self._regs: dict[int, _Registration] = {}  # first index -> registration
        self._firsts: list[int] = []  # first_qidx of each of self.requests
        self._by_stream: dict[tuple[str, int], list[_Registration]] = {}
        self._sources: dict[int, trio.MemorySendChannel] = {}  # transport index -> its source's requests
        self._live = 0

    # ------------------------------------------------------------ setup

    def add_requests(self, topic: str, seed: int, count: int) -> RequestStats:
        """Reserve ``count`` request indexes for a source of ``topic`` whose
        responses are keyed by ``seed``."""
        if self._next_qidx + count > RECEIVER_INDEX_BASE:
            raise ValueError(f"more than {RECEIVER_INDEX_BASE} request indexes in one context")
        st = RequestStats(topic, self._next_qidx, count, seed)
        self._next_qidx += count
        self.requests.append(st)
        self._firsts.append(st.first_qidx)
        return st

    def register(self, source_ip: str, tidx: int) -> tuple[int, trio.MemoryReceiveChannel]:
        """A receiver of topic index ``tidx`` from ``source_ip``: (its first
        request index, of ``REQUEST_INDEXES``; the channel of its answers).
        At most ``MAX_REGISTRATIONS`` at once (ValueError beyond); a block
        given back with :meth:`unregister` is used again."""
        if self._free_blocks:
            first = self._free_blocks.pop()
        elif self._next_block < 1 << 32:
            first = self._next_block
            self._next_block += REQUEST_INDEXES
        else:
            raise ValueError(f"{MAX_REGISTRATIONS} receivers registered with one request port")
        send, recv = trio.open_memory_channel(self.channel_size)
        reg = _Registration(first, source_ip, tidx, send)
        self._regs[first] = reg
        self._by_stream.setdefault((source_ip, tidx), []).append(reg)
        return first, recv

    def serve_source(self, transport_idx: int) -> trio.MemoryReceiveChannel:
        """The late-join and OTR requests (LJI_REQ, UME_RXREQ) naming the
        context's source of transport index ``transport_idx``: a bounded
        channel of (message, the address of the connection it came on).
        ValueError if that index has a source already."""
        if transport_idx in self._sources:
            raise ValueError(f"transport index {transport_idx} has a source already")
        send, recv = trio.open_memory_channel(self.channel_size)
        self._sources[transport_idx] = send
        return recv

    def unregister(self, first_idx: int) -> None:
        reg = self._regs.pop(first_idx, None)
        if reg is not None:
            self._by_stream[(reg.source, reg.tidx)].remove(reg)
            if not self._by_stream[(reg.source, reg.tidx)]:
                del self._by_stream[(reg.source, reg.tidx)]
            reg.send.close()
            self._free_blocks.append(reg.first_idx)

    # ------------------------------------------------------------ sorting

    def _owner(self, qidx: int):
        """The RequestStats or the registration request index ``qidx`` belongs to, or None."""
        if qidx >= RECEIVER_INDEX_BASE:
            return self._regs.get(qidx - qidx % REQUEST_INDEXES)
        k = bisect.bisect_right(self._firsts, qidx) - 1  # sources' ranges are given out in order
        if k >= 0 and qidx < self.requests[k].first_qidx + self.requests[k].count:
            return self.requests[k]
        return None

    def _deliver(self, reg: _Registration, m: lbmc.Message) -> None:
        try:
            reg.send.send_nowait(m)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.stats.overflow += 1

    def take(self, m: lbmc.Message, peer_ip: str) -> None:
        """Sort one message that came in from ``peer_ip``."""
        st = self.stats
        st.messages += 1
        dest = m.header(lbmc.DestinationHeader)
        if dest is not None:
            if m.kind == lbmc.MESSAGE and m.payload and m.payload == uim_payload(m.sqn, len(m.payload)):
                st.uims += 1
                hops = str(dest.hops_taken)
                if hops in st.uim_hops or len(st.uim_hops) < 64:
                    st.uim_hops[hops] = st.uim_hops.get(hops, 0) + 1
            else:
                st.uims_bad += 1
            return
        if m.kind == lbmc.MESSAGE and m.header(lbmc.RequestHeader) is None:
            owner = self._owner(m.tidx)
            if not isinstance(owner, RequestStats):
                st.unknown_qidx += 1
                return
            st.responses += 1
            if m.payload == response_payload(owner.seed, m.tidx, len(m.payload)) and m.payload:
                owner.responses[m.tidx] = owner.responses.get(m.tidx, 0) + 1
            else:
                owner.bad_payloads += 1
        elif m.kind == lbmc.CONTROL and m.header(lbmc.UmeLateJoinInfoHeader) is not None:
            owner = self._owner(m.header(lbmc.UmeLateJoinInfoHeader).qidx)
            if not isinstance(owner, _Registration):
                st.unknown_qidx += 1
                return
            self._deliver(owner, m)
        elif m.kind == lbmc.CONTROL and (req := recovery_request(m)) is not None:
            send = self._sources.get(req.transport_idx)
            if send is None:
                st.unknown_transport += 1
                return
            st.recovery_requests += 1
            try:
                send.send_nowait((m, peer_ip))
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                st.overflow += 1
        elif m.kind == lbmc.RETRANS:
            st.retransmissions += 1
            regs = self._by_stream.get((peer_ip, m.tidx))
            if not regs:
                st.unclaimed += 1
            for reg in regs or ():
                self._deliver(reg, m)
        else:
            st.other += 1

    # ------------------------------------------------------------ I/O

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the bound (ip, port) through ``task_status.started``,
        accept until cancelled. Raises OSError (e.g. EADDRINUSE) before ``started``."""
        listener = await open_tcp_listener(self.bind_ip, self.port, self.backlog)
        self.address = listener.socket.getsockname()[:2]
        async with listener, trio.open_nursery() as nursery:
            task_status.started(self.address)
            while True:
                try:
                    stream = await listener.accept()
                except OSError:  # e.g. EMFILE
                    await trio.sleep(0.05)
                    continue
                if self._live >= self.max_connections:
                    self.stats.refused += 1
                    await stream.aclose()
                    continue
                self.stats.connections += 1
                self._live += 1
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        buf = bytearray()  # at most one incomplete message (< 64 KiB) plus one read
        try:
            peer = stream.socket.getpeername()[0]
        except OSError:
            peer = "?"
        try:
            async with stream:
                while True:
                    with trio.move_on_after(self.idle_timeout) as idle:
                        data = await stream.receive_some(65536)
                    if idle.cancelled_caught:
                        self.stats.idle_closed += 1
                        return
                    if not data:
                        return
                    buf += data
                    # whole messages one by one: those before a malformed one are taken
                    pos = 0
                    while len(buf) - pos >= 4:
                        msglen = lbmc.check_start(buf, pos)[1]
                        if len(buf) - pos < msglen:
                            break
                        self.take(lbmc.decode(bytes(buf[pos:pos + msglen])), peer)
                        pos += msglen
                    del buf[:pos]
        except lbmc.LbmcDecodeError:
            self.stats.malformed += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._live -= 1

    def report(self) -> dict:
        return {"address": "{}:{}".format(*self.address) if self.address else None,
                "stats": asdict(self.stats), "requests": [r.as_dict() for r in self.requests]}


class Responder:
    """A receiver's answers to requests: one TCP connection per requester
    address (from ``bind_ip``), at most ``max_peers``, each send bounded by
    ``timeout`` seconds. ``sent``/``failed``/``refused`` count responses."""

    def __init__(self, bind_ip: str | None, seed: int, *, max_peers: int = 16, timeout: float = 5.0) -> None:
        self.bind_ip, self.seed, self.max_peers, self.timeout = bind_ip, seed, max_peers, timeout
        self.sent = 0
        self.failed = 0
        self.refused = 0
        self._streams: dict[Addr, trio.SocketStream | None] = {}
        self._lock = trio.Lock()  # live and recovered requests are answered from two tasks

    async def respond(self, req: lbmc.RequestHeader, source_ip: str) -> None:
        """Answer ``req``, which came from the source at ``source_ip``: only
        there (:func:`same_party`; its address 0.0.0.0 means that one; another
        is refused and counted in ``refused``: a request never sends us to a
        third party)."""
        ip = req.ipaddr if req.ipaddr != "0.0.0.0" else source_ip
        addr = (ip, req.port)
        if not same_party(ip, source_ip) or not req.port or req.transport != 0:
            self.refused += 1
            return
        async with self._lock:
            if await self._send(addr, req.qidx):
                return
        self.failed += 1

    async def _send(self, addr: Addr, qidx: int) -> bool:
        with trio.move_on_after(self.timeout):
            try:
                stream = await self._stream(addr)
                if stream is not None:
                    await stream.send_all(response_message(self.seed, qidx))
                    self.sent += 1
                    return True
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                self._streams[addr] = None
        return False

    async def _stream(self, addr: Addr) -> trio.SocketStream | None:
        if addr in self._streams:
            return self._streams[addr]
        if len(self._streams) >= self.max_peers:
            return None
        self._streams[addr] = None
        self._streams[addr] = await connect_from(self.bind_ip, addr)
        return self._streams[addr]

    async def aclose(self) -> None:
        for s in self._streams.values():
            if s is not None:
                await s.aclose()
        self._streams.clear()


def recovery_request(m: lbmc.Message):
    """The LJI_REQ or UME_RXREQ header of ``m``, or None."""
    req = m.header(lbmc.LateJoinRequestHeader)
    return req if req is not None else m.header(lbmc.UmeRxReqHeader)


def same_party(named: str, peer: str) -> bool:
    """May a request from ``peer`` send an answer to ``named``? Only to the
    peer's own address, or between two loopback addresses (the simulator's
    contexts and a router's portals on one host use several)."""
    return named == peer or (named.startswith("127.") and peer.startswith("127."))


async def connect_from(bind_ip: str | None, addr: Addr) -> trio.SocketStream:
    """A TCP connection to ``addr`` from ``bind_ip`` (None: the kernel's choice)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if bind_ip is not None:
            await sock.bind((bind_ip, 0))
        await sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)
