"""UM's request/response, late join and OTR on the live TCP stream
(see :mod:`lbmr_tools.sim.dataplane`, :mod:`.uim` and lbmr-sim(1)).

* :class:`UmTcpSource` is a :class:`.tcp.TcpDataSource` that can send
  requests (messages of its live stream with a REQUEST header naming its
  context's request port) and keeps a retention buffer of its last
  ``retention`` messages (their range: a payload is derived from its
  sequence number, nothing is stored). A late-join request (LJI_REQ) or an
  OTR request (UME_RXREQ) from a receiver, a UIM that came to its context's
  request port (:meth:`.uim.RequestPort.serve_source`: the port and transport
  index its TIR's late-join option names), is answered by connecting to the
  port the request names and sending UME_LJ_INFO (late join) and the
  retained messages as RETRANS.
* :class:`UmTcpReceiver` verifies the stream like a
  :class:`.tcp.TcpDataReceiver` and answers every request it sees
  (:class:`.uim.Responder`); with ``late_join`` it asks for the retained
  messages once the first live one is in, with ``otr`` it asks for every
  message missing from the stream (``drop_every`` discards some on purpose),
  sending its requests as UIMs to the source's request port (one TCP
  connection), and takes the answers from its context's
  :class:`.uim.RequestPort`.
  :class:`.live.Repair` is its sans-IO core: which sequence numbers it has and
  which are missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from lbmr_proto import lbmc, lbmc_stream

from .live import Repair, RepairCounts, StreamMismatch, count_control, message_payload
from .tcp import TcpDataReceiver, TcpDataSource, TcpReceiveResult
from .uim import REQUEST_INDEXES, RequestPort, Responder, connect_from, request_header, same_party

__all__ = ["UmTcpSource", "UmTcpReceiver", "UmTcpReceiveResult", "retrans_message"]

Addr = tuple[str, int]
MAX_PENDING = 4096  # answers queued for one requester address


def retrans_message(seed: int, tidx: int, sqn: int, size: int, *headers) -> bytes:
    """Message ``sqn`` of the stream again, as a RETRANS (with the headers it
    had: a request's REQUEST header)."""
    sqn &= 0xFFFFFFFF
    return lbmc.encode(lbmc.Message(lbmc.RETRANS, tidx, sqn, bytes(message_payload(seed, sqn, size)), headers))


class _Answers:
    """What one requester address is owed: LJI_REQ / UME_RXREQ headers, in order."""

    __slots__ = ("pending", "wake")

    def __init__(self) -> None:
        self.pending: list = []
        self.wake = trio.Event()


class UmTcpSource(TcpDataSource):
    """A :class:`.tcp.TcpDataSource` with requests and a retention buffer.

    ``requests`` requests ride messages ``request_interval``,
    ``2 * request_interval``, ...: request ``i`` has index ``first_qidx + i``
    and names ``request_port`` (ip, port); ``requests_sent[i]`` is the number
    of receivers it went to. With ``retention`` > 0 the last ``retention``
    messages made can be had again: an LJI_REQ gets UME_LJ_INFO (the range,
    at most ``rx_req_max`` messages when that is non-zero, and the request
    index as ``qidx``) then those messages as RETRANS; a UME_RXREQ gets its
    message as RETRANS when it is still retained (else ``counters
    ["rx_unavailable"]``); the requests come from :meth:`take_requests`.
    Answers go to the address the request names over
    one connection per address (from ``bind_ip``), at most ``max_answers``
    addresses and ``MAX_PENDING`` requests each, and only to the address the
    request came from (:func:`.uim.same_party`; a request naming another
    address is refused: no reflection); each connection and send of at most 64 messages is bounded
    by ``answer_timeout`` seconds.
    """

    def __init__(self, bind_ip: str = "127.0.0.1", port: int = 0, *, requests: int = 0,
                 request_interval: int = 100, request_port: Addr | None = None, first_qidx: int = 0,
                 retention: int = 0, max_answers: int = 64, answer_timeout: float = 5.0, **kw) -> None:
        super().__init__(bind_ip, port, **kw)
        if requests < 0 or request_interval < 1 or retention < 0:
            raise ValueError("requests and retention must be >= 0, request_interval >= 1")
        if requests and request_port is None:
            raise ValueError("requests need the request port they name")
        self.requests, self.request_interval = requests, request_interval
        self.request_port, self.first_qidx = request_port, first_qidx
        self.retention = retention
        self.max_answers, self.answer_timeout = max_answers, answer_timeout
        self.requests_sent: list[int] = []
        self.counters = dict.fromkeys(("lj_requests", "lj_answered", "rx_requests", "rx_answered",
                                       "rx_unavailable", "retransmissions", "answers_refused",
                                       "answer_failures", "wrong_topic", "other_control"), 0)
        self._answers: dict[Addr, _Answers] = {}

    @property
    def retained(self) -> tuple[int, int]:
        """(lowest, highest) sequence number retained; highest < lowest when none."""
        top = self.clock.next_sqn - 1
        return (max(0, top - self.retention + 1), top)

    def _batch(self, sqn: int, n: int) -> bytes:
        if not self.requests:
            return super()._batch(sqn, n)
        out = []
        for q in range(sqn, sqn + n):
            hdr = self._request_at(q)
            if hdr is not None:
                out.append(lbmc.data_message(self.tidx, q & 0xFFFFFFFF,
                                             message_payload(self.seed, q, self.message_size), hdr))
                self.requests_sent.append(len(self._live))
            else:
                out.append(super()._batch(q, 1))
        return b"".join(out)

    def _request_at(self, sqn: int) -> lbmc.RequestHeader | None:
        """The REQUEST header message ``sqn`` carries, if it is a request."""
        every = self.request_interval
        i = sqn // every - 1
        if self.requests and sqn % every == 0 and 0 <= i < self.requests:
            return request_header(self.first_qidx + i, *self.request_port)
        return None

    def _from_receiver(self, c, raw: bytes) -> None:
        """A message a receiver sent upstream on its data connection: UM's
        receivers send late-join and OTR requests to the source's request port
        (:meth:`take_requests`), so it is only counted."""
        self.counters["other_control"] += 1

    async def take_requests(self, requests: trio.MemoryReceiveChannel) -> None:
        """Answer the late-join and OTR requests of ``requests`` (the channel
        :meth:`.uim.RequestPort.serve_source` gives for this source's transport
        index; (message, sender's address)) until it closes. A request for
        another topic index is refused (counted ``wrong_topic``)."""
        async for m, peer_ip in requests:
            lji = m.header(lbmc.LateJoinRequestHeader)
            rxreq = m.header(lbmc.UmeRxReqHeader)
            if lji is not None:
                self.counters["lj_requests"] += 1
                if lji.topic_idx != self.tidx:
                    self.counters["wrong_topic"] += 1
                    continue
                self._owe(peer_ip, (lji.req_ip, lji.req_port), lji)
            elif rxreq is not None:
                self.counters["rx_requests"] += 1
                if rxreq.id_2 != self.tidx:
                    self.counters["wrong_topic"] += 1
                    continue
                self._owe(peer_ip, (rxreq.rx_ip, rxreq.rx_port), rxreq)

    def _owe(self, peer_ip: str, addr: Addr, req) -> None:
        """Queue the answer to ``req``, which came from ``peer_ip``, for
        ``addr``: only on the requester's own address (0.0.0.0: that address;
        :func:`.uim.same_party`), never a third party's (no reflection)."""
        if addr[0] == "0.0.0.0":
            addr = (peer_ip, addr[1])
        if not same_party(addr[0], peer_ip) or not addr[1]:
            self.counters["answers_refused"] += 1
            return
        a = self._answers.get(addr)
        if a is None:
            if len(self._answers) >= self.max_answers or self._nursery is None or not self.retention:
                self.counters["answers_refused"] += 1
                return
            a = self._answers[addr] = _Answers()
            self._nursery.start_soon(self._answer, addr, a)
        if len(a.pending) >= MAX_PENDING:
            self.counters["answers_refused"] += 1
            return
        a.pending.append(req)
        a.wake.set()

    def _retrans(self, sqn: int) -> bytes:
        self.counters["retransmissions"] += 1
        hdr = self._request_at(sqn)
        return retrans_message(self.seed, self.tidx, sqn, self.message_size, *(() if hdr is None else (hdr,)))

    def _answer_parts(self, req):
        """The answer to ``req`` in pieces of at most 64 messages (a late
        join may be a whole retention buffer: it is made as it is sent)."""
        low, high = self.retained
        if isinstance(req, lbmc.LateJoinRequestHeader):
            if req.rx_req_max:
                low = max(low, high - req.rx_req_max + 1)
            info = lbmc.Message(lbmc.CONTROL, headers=(
                lbmc.UmeLateJoinInfoHeader(0, low & 0xFFFFFFFF, high & 0xFFFFFFFF, req.request_idx),))
            self.counters["lj_answered"] += 1
            yield lbmc.encode(info)
            for q in range(low, high + 1, 64):
                yield b"".join(self._retrans(x) for x in range(q, min(q + 64, high + 1)))
            return
        # an OTR request: the sequence number is 32 bits on the wire, the source's count is not
        top = high & ~0xFFFFFFFF | req.seqnum
        sqn = top if top <= high else top - (1 << 32)
        if low <= sqn <= high:
            self.counters["rx_answered"] += 1
            yield self._retrans(sqn)
        else:
            self.counters["rx_unavailable"] += 1

    async def _answer(self, addr: Addr, a: _Answers) -> None:
        """Serve what ``addr`` is owed, over one connection, until cancelled or it fails."""
        stream = None
        try:
            while True:
                await a.wake.wait()
                a.wake = trio.Event()
                reqs, a.pending = a.pending, []
                for req in reqs:
                    for data in self._answer_parts(req):
                        with trio.move_on_after(self.answer_timeout) as scope:
                            if stream is None:
                                stream = await connect_from(self.bind_ip, addr)
                            await stream.send_all(data)
                        if scope.cancelled_caught:
                            raise OSError(f"answer to {addr[0]}:{addr[1]} not taken in {self.answer_timeout:g} s")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.counters["answer_failures"] += 1
        finally:
            self._answers.pop(addr, None)
            if stream is not None:
                stream.socket.close()


@dataclass
class UmTcpReceiveResult(TcpReceiveResult, RepairCounts):
    """A :class:`.tcp.TcpReceiveResult` plus: requests seen and responses
    sent; the repair counts (:class:`.live.RepairCounts`: messages discarded
    on purpose, found missing, recovered by late join or OTR, still missing
    at the end); the late-join answer (``lj_low``/``lj_high``, None before)
    and the OTR requests sent. ``messages`` counts every verified message,
    ``first_sqn``..``last_sqn`` the whole range (retained ones too)."""

    requests_seen: int = 0
    responses_sent: int = 0
    responses_failed: int = 0
    responses_refused: int = 0  # requests naming a third party's address
    lj_low: int | None = None
    lj_high: int | None = None
    otr_requests: int = 0

    @property
    def ok(self) -> bool:
        return super().ok and self.unrecovered == 0


class UmTcpReceiver(TcpDataReceiver):
    """A :class:`.tcp.TcpDataReceiver` that answers requests and repairs its
    stream (see the module docstring). ``request_port``: its context's
    :class:`.uim.RequestPort` (needed for ``late_join`` and ``otr``), whose
    address the requests name; ``source_request``: (ip, port, transport
    index) of the source's request port as its TIR's late-join option names
    them (needed too), where the requests go, each send bounded by
    ``idle_timeout``; ``drop_every`` n > 0 discards the first copy
    of every live message whose sequence is n-1 mod n (with ``otr``). With
    ``respond`` every request seen gets a response from ``bind_ip``. It is
    done once it has ``expect_bytes`` payload bytes, nothing is missing and,
    with ``late_join``, the late-join answer is in."""

    def __init__(self, connect_ip: str, port: int, expect_bytes: int | None, seed: int = 0, *,
                 request_port: RequestPort | None = None, source_request: tuple[str, int, int] | None = None,
                 respond: bool = True, late_join: bool = False, otr: bool = False, drop_every: int = 0,
                 **kw) -> None:
        super().__init__(connect_ip, port, expect_bytes, seed, **kw)
        if (late_join or otr) and (request_port is None or source_request is None):
            raise ValueError("late join and OTR need the receiver's request port and the source's")
        self.source_request = source_request
        self._uim: trio.SocketStream | None = None  # to the source's request port
        if drop_every < 0 or (drop_every and not otr):
            raise ValueError("drop_every needs otr (and must be >= 0)")
        self.request_port, self.respond = request_port, respond
        self.late_join, self.otr, self.drop_every = late_join, otr, drop_every
        self.result = UmTcpReceiveResult(peer=self.result.peer, expect_bytes=expect_bytes)
        self.repair = Repair(self.result, self.seed, self.tidx)
        self.responder = Responder(self.bind_ip, self.seed)
        self._first_idx: int | None = None
        self._answers = None
        self._next_idx = 0
        self._lj_pending = False
        self._changed = trio.Event()
        self._registered = trio.Event()

    def _done(self) -> bool:
        return self._enough() and not self.repair.pending and not self._lj_pending

    def _covered(self) -> bool:
        """The stream so far (verified, discarded, retained) makes the expected bytes."""
        if self.expect_bytes is not None:
            return self.repair.covered_bytes >= self.expect_bytes
        return self._enough()

    def _request_idx(self) -> int:
        idx = self._first_idx + self._next_idx % REQUEST_INDEXES
        self._next_idx += 1
        return idx

    def _my_port(self) -> Addr:
        return self.request_port.address

    async def _read(self, stream: trio.SocketStream, t0: float) -> None:
        r = self.result
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._take_answers, nursery.cancel_scope)
                await self._read_stream(stream, t0)
                if r.error is None and not self._done():  # keep taking the stream: never pace the source
                    nursery.start_soon(self._drain, stream)
                while r.error is None and not self._done():  # the stream is read; repairs may still come
                    with trio.move_on_after(self.idle_timeout) as idle:
                        await self._changed.wait()
                    self._changed = trio.Event()
                    if idle.cancelled_caught:
                        r.error = (f"{self.repair.pending} messages still missing after "
                                   f"{self.idle_timeout:g} s" if self.repair.pending else
                                   f"no late-join answer in {self.idle_timeout:g} s")
                        break
                nursery.cancel_scope.cancel()
        except StreamMismatch as e:
            r.error = r.error or str(e)
        finally:
            if self._first_idx is not None:
                self.request_port.unregister(self._first_idx)
            with trio.CancelScope(shield=True):
                await self.responder.aclose()
                if self._uim is not None:
                    await trio.aclose_forcefully(self._uim)
            rs = self.responder
            r.responses_sent, r.responses_failed, r.responses_refused = rs.sent, rs.failed, rs.refused

    @staticmethod
    async def _drain(stream: trio.SocketStream) -> None:
        """Read and drop the live stream while repairs are awaited."""
        try:
            while await stream.receive_some(1 << 16):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def _take_answers(self, scope: trio.CancelScope) -> None:
        """The answers the request port hands over; a bad one ends the run (``scope``)."""
        await self._registered.wait()
        try:
            async for m in self._answers:
                if m.kind == lbmc.CONTROL:
                    info = m.header(lbmc.UmeLateJoinInfoHeader)
                    self.repair.late_join(info.low_seqnum, info.high_seqnum)
                    self._lj_pending = False
                elif self.repair.retrans(m):
                    await self._request(m)
                self._changed.set()
        except StreamMismatch as e:
            self.result.error = self.result.error or f"retransmission: {e}"
            scope.cancel()

    async def _read_stream(self, stream: trio.SocketStream, t0: float) -> None:
        r = self.result
        framer = lbmc_stream.StreamFramer()
        rate = self.rate_limit_bps
        while not self._done():
            if self._covered():  # waiting for repairs only: no more of the stream
                return
            data = await self._receive(stream, self.read_size)
            if not data:
                return
            try:
                raws = framer.feed(data)
            except lbmc.LbmcDecodeError as e:
                r.error = f"not an LBMC stream: {e}"
                return
            for raw in raws:
                await self._message(stream, lbmc.decode(raw))
                if self._covered():
                    break
            self._changed.set()
            if rate is not None:
                await trio.sleep_until(t0 + r.stream_bytes / rate)

    async def _message(self, stream: trio.SocketStream, m: lbmc.Message) -> None:
        r = self.result
        if count_control(r, m):
            return
        first = self.repair.next_live is None
        drop = bool(self.drop_every) and m.sqn % self.drop_every == self.drop_every - 1
        missing = self.repair.live(m, discard=drop)
        if first and (self.late_join or self.otr):
            self._first_idx, self._answers = self.request_port.register(self.addr[0], self.repair.tidx)
            self._registered.set()
        if first and self.late_join:
            ip, port = self._my_port()
            self._lj_pending = True
            await self._send_uim(lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
                lbmc.LateJoinRequestHeader(0, self._request_idx(), self.source_request[2], self.repair.tidx,
                                           ip, port),))))
        if missing and self.otr:
            ip, port = self._my_port()
            tix = self.source_request[2]
            reqs = [lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
                lbmc.UmeRxReqHeader(0, self._request_idx(), tix, self.repair.tidx, q & 0xFFFFFFFF, port, 0, ip),)))
                for q in missing]
            r.otr_requests += len(reqs)
            await self._send_uim(b"".join(reqs))
        if not drop:
            await self._request(m)

    async def _send_uim(self, data: bytes) -> None:
        """Send ``data`` (whole requests) to the source's request port, over
        one connection opened at the first (from ``bind_ip``); a failure or a
        send that takes longer than ``idle_timeout`` ends the run."""
        with trio.move_on_after(self.idle_timeout) as scope:
            try:
                if self._uim is None:
                    self._uim = await connect_from(self.bind_ip, self.source_request[:2])
                await self._uim.send_all(data)
                return
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise StreamMismatch(f"the source's request port {self.source_request[0]}:"
                                     f"{self.source_request[1]}: {e}") from None
        if scope.cancelled_caught:
            raise StreamMismatch(f"the source's request port {self.source_request[0]}:"
                                 f"{self.source_request[1]} took no request in {self.idle_timeout:g} s")

    async def _request(self, m: lbmc.Message) -> None:
        """Answer ``m`` if it is a request (live or recovered)."""
        req = m.header(lbmc.RequestHeader)
        if req is not None:
            self.result.requests_seen += 1
            if self.respond:
                await self.responder.respond(req, self.addr[0])
