"""Section 6 of bench/router.py: requests and responses across a router pair
against the same two programs in one TRD, in the same run.

* The requester (:func:`requester_main`, a process of its own at SRC_IP in
  TRD1) is a UM TCP source whose messages are requests: a TCP_SID control
  message on each connection, then LBMC data messages each with a REQUEST
  header naming its request port (a TCP listener at SRC_IP; every responder
  keeps one connection to it). It advertises its topic to TRD1's lbmrd every
  0.5 s. Every response is an LBMC data message whose payload starts with
  the request index (u32, big-endian) and the responder's number (u32).
* Each responder (:func:`responder_main`, a process of its own) resolves the
  topic through its TRD's lbmrd (TQRs every 50 ms until a TIR that is not a
  final advertisement comes), connects to the source it names (router B's
  proxy across the pair; the requester itself in one TRD), and answers every
  request with one response of RESPONSE_BYTES payload bytes, one ``send`` a
  response, on one connection per requester address, kept open (UM's model).
* Warm-up: the requester sends a request every 20 ms until one of them is
  answered by every responder (all of them joined and connected), then
  measures:

  - round trip (``rtt``): ``count`` requests one at a time, each sent once
    the previous one's response is in, one responder; from before the
    ``send`` of the request to after the response is read and framed, and
    its two legs: the request carries its send time, the response the time
    the responder read the request (CLOCK_MONOTONIC, nanoseconds: one clock
    for every process of the host);
  - responses per second (``rate``): ``count`` requests to ``responders``
    responders, at most ``window`` outstanding (a request is outstanding
    until every responder answered it); responses / seconds from the first
    request sent to the last response read.

All sockets have TCP_NODELAY (UM's TCP default), both paths alike. The
requester prints one JSON line and exits; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import lbmr_proto as L
from bench.router_deploy import PY, RCV_IP, ROOT, SRC_IP, Processes
from lbmr_proto import lbmc, lbmc_stream

RESPONSE_BYTES = 64  # payload bytes of a response (lbmr-sim's)
REQUEST_TIDX = 1
REQUEST_SID = 0x5EB1
WARMUP_TIMEOUT_S = 20.0
RUN_TIMEOUT_S = 60.0
REQUESTER_CODE = "import sys; from bench.router_requests import requester_main; sys.exit(requester_main(sys.argv[1:]))"
RESPONDER_CODE = "import sys; from bench.router_requests import responder_main; sys.exit(responder_main(sys.argv[1:]))"


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _tir(topic: str, ip: str, port: int) -> bytes:
    return L.encode(L.Packet(0, 1, tirs=[L.TIR(topic, L.TcpSessionTransport(ip=ip, session_id=REQUEST_SID, port=port), 60, REQUEST_TIDX)]))


def _now_ns() -> int:
    """CLOCK_MONOTONIC, nanoseconds: one clock for every process of the host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _response(qidx: int, rid: int, sqn: int, sent_ns: int, seen_ns: int) -> bytes:
    """Response ``sqn`` of responder ``rid`` to request ``qidx``: the payload starts with
    qidx and rid (u32), the request's send time and the time the responder read it (u64
    nanoseconds of CLOCK_MONOTONIC), all big-endian; RESPONSE_BYTES in all."""
    body = qidx.to_bytes(4, "big") + rid.to_bytes(4, "big") + sent_ns.to_bytes(8, "big") + seen_ns.to_bytes(8, "big")
    return lbmc.data_message(0, sqn & 0xFFFFFFFF, body + bytes(RESPONSE_BYTES - len(body)))


# ---------------------------------------------------------------- the requester process

class _Requester:
    """The requester's sockets and its one selector loop (see the module doc)."""

    def __init__(self, ip: str, topic: str, lbmrd: tuple[str, int], responders: int) -> None:
        self.ip, self.responders = ip, responders
        self.src = socket.create_server((ip, 0), backlog=64)
        self.req = socket.create_server((ip, 0), backlog=64)
        self.req_port = self.req.getsockname()[1]
        for s in (self.src, self.req):
            s.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.src, selectors.EVENT_READ, "src")
        self.sel.register(self.req, selectors.EVENT_READ, "req")
        self.sinks: list[socket.socket] = []  # source connections: every request goes to each
        self.framers: dict[socket.socket, lbmc_stream.StreamFramer] = {}
        self.answers: dict[int, set[int]] = {}  # qidx -> the responders that answered it
        self.first_answer: dict[int, int] = {}  # qidx -> when its first response was read (_now_ns)
        self.legs: dict[int, tuple[int, int]] = {}  # qidx -> (request leg, response leg) of that one, ns
        self.last_read = 0  # when the latest response was read (_now_ns)
        self.sqn = 0
        self.stop = threading.Event()
        self.tir = _tir(topic, ip, self.src.getsockname()[1])
        self.lbmrd = lbmrd
        self.adv = threading.Thread(target=self._advertise, daemon=True)
        self.adv.start()

    def _advertise(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind((self.ip, 0))
            while not self.stop.is_set():
                with contextlib.suppress(OSError):
                    u.sendto(self.tir, self.lbmrd)
                self.stop.wait(0.5)

    def send_request(self, qidx: int) -> int:
        """Request ``qidx`` to every receiver; when it was sent (_now_ns, also in its payload,
        u64 big-endian)."""
        h = lbmc.RequestHeader(transport=0, qidx=qidx, port=self.req_port, ipaddr=self.ip)
        sent = _now_ns()
        msg = lbmc.data_message(REQUEST_TIDX, self.sqn, sent.to_bytes(8, "big") + b"request %d" % qidx, h)
        self.sqn += 1
        for s in list(self.sinks):
            try:
                s.sendall(msg)
            except OSError:
                self.sinks.remove(s)
                s.close()
        return sent

    def poll(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            s, what = key.fileobj, key.data
            if what == "src":
                with contextlib.suppress(BlockingIOError):
                    c, _ = s.accept()
                    c.setblocking(True)
                    c.settimeout(10.0)
                    _nodelay(c)
                    c.sendall(lbmc.encode(lbmc.Message(lbmc.CONTROL, headers=(
                        lbmc.TcpSidHeader(session_id=REQUEST_SID),))))
                    self.sinks.append(c)
            elif what == "req":
                with contextlib.suppress(BlockingIOError):
                    c, _ = s.accept()
                    c.setblocking(False)
                    _nodelay(c)
                    self.framers[c] = lbmc_stream.StreamFramer()
                    self.sel.register(c, selectors.EVENT_READ, "rsp")
            else:
                try:
                    data = s.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(s)
                    self.framers.pop(s, None)
                    s.close()
                    continue
                now = _now_ns()
                for m in self.framers[s].feed(data):
                    payload = lbmc.decode(m).payload
                    q, rid = int.from_bytes(payload[:4], "big"), int.from_bytes(payload[4:8], "big")
                    self.answers.setdefault(q, set()).add(rid)
                    self.last_read = now
                    if q not in self.first_answer:
                        self.first_answer[q] = now
                        sent, seen = int.from_bytes(payload[8:16], "big"), int.from_bytes(payload[16:24], "big")
                        self.legs[q] = seen - sent, now - seen

    def done(self, qidx: int) -> bool:
        return len(self.answers.get(qidx, ())) >= self.responders

    def warm_up(self) -> None:
        """A request every 20 ms until one is answered by every responder."""
        deadline = time.monotonic() + WARMUP_TIMEOUT_S
        q, sent = 0, []
        while not any(self.done(x) for x in sent):
            if time.monotonic() > deadline:
                raise TimeoutError(f"warm-up: no request answered by {self.responders} responders "
                                   f"within {WARMUP_TIMEOUT_S:g} s ({len(self.sinks)} receivers)")
            self.send_request(q)
            sent.append(q)
            q += 1
            end = time.monotonic() + 0.02
            while (left := end - time.monotonic()) > 0:
                self.poll(left)
        end = time.monotonic() + 0.1  # the answers to the last warm-up requests
        while (left := end - time.monotonic()) > 0:
            self.poll(left)

    def round_trips(self, count: int) -> dict[str, list[float]]:
        """``count`` requests one at a time: per request the round trip, and its request
        leg (requester to responder) and response leg, seconds."""
        out: dict[str, list[float]] = {"rtt": [], "request_leg": [], "response_leg": []}
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for i in range(count):
            q = 1_000_000 + i
            t0 = self.send_request(q)
            while q not in self.first_answer:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"round trips: {i} of {count} within {RUN_TIMEOUT_S:g} s")
                self.poll(1.0)
            out["rtt"].append((self.first_answer[q] - t0) / 1e9)
            out["request_leg"].append(self.legs[q][0] / 1e9)
            out["response_leg"].append(self.legs[q][1] / 1e9)
        return out

    def rate(self, count: int, window: int) -> tuple[int, float]:
        """(responses, seconds) for ``count`` requests, at most ``window`` outstanding."""
        base = 2_000_000
        deadline = time.monotonic() + RUN_TIMEOUT_S
        sent = completed = 0
        t0 = _now_ns()
        while completed < count:
            while sent < count and sent - completed < window:
                self.send_request(base + sent)
                sent += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"rate: {completed} of {count} requests answered within {RUN_TIMEOUT_S:g} s")
            self.poll(1.0)
            while completed < sent and self.done(base + completed):
                completed += 1
        got = sum(len(self.answers.get(base + i, ())) for i in range(count))
        return got, (self.last_read - t0) / 1e9

    def close(self) -> None:
        self.stop.set()
        self.adv.join(2)
        for s in [*self.sinks, *self.framers, self.src, self.req]:
            s.close()
        self.sel.close()


def requester_main(argv: list[str]) -> int:
    """argv: one JSON object: ip, topic, lbmrd [ip, port], responders, mode ("rtt" or
    "rate"), count, window. Prints one JSON line: {"rtt": [seconds, ...],
    "request_leg": [...], "response_leg": [...]} or {"responses": n, "seconds":
    s}, with "requester_cpu" (its CPU seconds over the measurement), or
    {"error": "..."}; exit status 0 or 1."""
    a = json.loads(argv[0])
    r = _Requester(a["ip"], a["topic"], tuple(a["lbmrd"]), a["responders"])
    try:
        r.warm_up()
        cpu = time.process_time()
        if a["mode"] == "rtt":
            out = r.round_trips(a["count"])
        else:
            got, secs = r.rate(a["count"], a["window"])
            out = {"responses": got, "seconds": secs}
        out["requester_cpu"] = time.process_time() - cpu  # seconds, the measurement only
    except (TimeoutError, OSError, lbmc.LbmcDecodeError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    finally:
        r.close()
    print(json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------- a responder process

def _resolve(topic: str, ip: str, lbmrd: tuple[str, int], timeout: float) -> tuple[str, int]:
    """The TCP source of ``topic`` in the TRD of ``lbmrd``: TQRs every 50 ms from ``ip``
    until a TIR for it that is not a final advertisement (cost -1) comes."""
    tqr = L.encode(L.Packet(0, 1, tqrs=[L.TQR(topic)]))
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.bind((ip, 0))
        u.settimeout(0.05)
        while time.monotonic() < deadline:
            u.sendto(tqr, lbmrd)
            with contextlib.suppress(TimeoutError):
                while True:
                    data = u.recv(65535)
                    try:
                        pkt = L.decode(data)
                    except Exception:  # noqa: BLE001 - lbmrd keepalives and anything else not LBMR
                        continue
                    for t in pkt.tirs:
                        final = any(isinstance(o, L.CostOption) and o.cost == -1 for o in t.options or ())
                        if t.topic == topic and not final and getattr(t.transport, "NAME", "") == "TCP":
                            return t.transport.ip, t.transport.port
    raise TimeoutError(f"no TIR for {topic} from {lbmrd} within {timeout:g} s")


def responder_main(argv: list[str]) -> int:
    """argv: one JSON object: ip (where it binds), topic, lbmrd [ip, port], rid (its
    number). Answers every request until the source's connection ends or
    RUN_TIMEOUT_S + WARMUP_TIMEOUT_S pass; exit status 0, or 1 with a line on stderr."""
    a = json.loads(argv[0])
    ip, rid = a["ip"], a["rid"]
    end = time.monotonic() + RUN_TIMEOUT_S + WARMUP_TIMEOUT_S
    to_requester: dict[tuple[str, int], socket.socket] = {}
    sqn = 0
    try:
        source = _resolve(a["topic"], ip, tuple(a["lbmrd"]), WARMUP_TIMEOUT_S)
        s = _nodelay(socket.socket())
        s.bind((ip, 0))
        s.settimeout(WARMUP_TIMEOUT_S)
        s.connect(source)
        framer = lbmc_stream.StreamFramer()
        with s:
            while time.monotonic() < end:
                data = s.recv(1 << 16)
                if not data:
                    return 0
                seen = _now_ns()
                for m in framer.feed(data):
                    d = lbmc.decode(m)
                    h = d.header(lbmc.RequestHeader)
                    if h is None:
                        continue
                    c = to_requester.get((h.ipaddr, h.port))
                    if c is None:
                        c = to_requester[h.ipaddr, h.port] = _nodelay(socket.socket())
                        c.bind((ip, 0))
                        c.settimeout(10.0)
                        c.connect((h.ipaddr, h.port))
                    c.sendall(_response(h.qidx, rid, sqn, int.from_bytes(d.payload[:8], "big"), seen))
                    sqn += 1
    except (OSError, lbmc.LbmcDecodeError) as e:
        print(f"responder {rid}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for c in to_requester.values():
            c.close()
    return 0


# ---------------------------------------------------------------- section 6 of bench/router.py

def _counters(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.loads(r.read())["counters"]


def run_case(dep: Processes, path: str, mode: str, count: int, responders: int, window: int,
             tag: str) -> dict:
    """One requester and ``responders`` responders: ``path`` "direct" (all in TRD1,
    through lbmrd 1) or "routed" (responders in TRD2, across the pair); the
    requester's result (module doc)."""
    topic = f"bench.router.requests.{tag}.{mode}.{path}"
    lbmrd = dep.lbmrd1 if path == "direct" else dep.lbmrd2
    net = "127.0.1." if path == "direct" else "127.0.2."
    spec = {"ip": SRC_IP, "topic": topic, "lbmrd": dep.lbmrd1, "responders": responders, "mode": mode,
            "count": count, "window": window}
    procs: list[subprocess.Popen] = []
    try:
        req = subprocess.Popen(PY + [REQUESTER_CODE, json.dumps(spec)], cwd=ROOT, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, text=True)
        procs.append(req)
        for i in range(responders):
            rip = RCV_IP if (path == "routed" and i == 0) else f"{net}{30 + i}"
            procs.append(subprocess.Popen(
                PY + [RESPONDER_CODE, json.dumps({"ip": rip, "topic": topic, "lbmrd": lbmrd, "rid": i})],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        cpu0 = dep.cpu()
        try:
            out, _ = req.communicate(timeout=WARMUP_TIMEOUT_S + RUN_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            return {"error": "the requester did not finish"}
        cpu1 = dep.cpu()
        lines = out.strip().splitlines()
        if not lines:
            return {"error": f"the requester exited with {req.returncode}"}
        result = json.loads(lines[-1])
        result["router_cpu"] = {k: cpu1[k] - cpu0[k] for k in cpu0}  # seconds, set-up and warm-up included
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()


def request_rows(tmp: Path, stack: contextlib.ExitStack, args) -> dict:
    """Section 6: a deployment of the shipped configs (fan-out on, the default),
    then ``args.rr_runs`` rounds, each measuring the round trip and the
    responses per second, direct and routed back to back (the order
    alternating from round to round). Returns {(mode, path): [result of each
    round], "counters": the routers' request counters over the section (B's
    plus A's)}."""
    dep = Processes(tmp, tag="requests", fanout=True)
    stack.callback(dep.stop)
    dep.start()
    before = _counters(dep.metrics_b), _counters(dep.metrics_a)
    res: dict = {}
    for k in range(args.rr_runs):
        order = ("direct", "routed") if k % 2 == 0 else ("routed", "direct")
        for mode, count, responders in (("rtt", args.rr_count, 1),
                                        ("rate", args.rr_rate_count, args.rr_responders)):
            for path in order:
                res.setdefault((mode, path), []).append(
                    run_case(dep, path, mode, count, responders, args.rr_window, f"r{k}"))
    after = _counters(dep.metrics_b), _counters(dep.metrics_a)
    keys = ("requests_rewritten", "request_listeners_opened", "response_streams_opened",
            "responses_delivered", "responses_refused_unseen", "requests_unmapped_waiting")
    res["counters"] = {k: after[0].get(k, 0) - before[0].get(k, 0) + after[1].get(k, 0) - before[1].get(k, 0)
                       for k in keys}
    return res


def _pct(vals: list[float], p: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, int(p * len(s)))]


def _ms(v: float) -> str:
    return f"{1000 * v:7.3f} ms"


def _print_cpu(results: list[dict], key: str, what: str) -> None:
    """The routers' CPU time per round trip or response over the routed rounds
    (their set-up, resolution and warm-up included: a little high)."""
    ok = [r for r in results if key in r and "router_cpu" in r]
    n = sum(len(r[key]) if isinstance(r[key], list) else r[key] for r in ok)
    if not n:
        return
    per = {k: sum(r["router_cpu"][k] for r in ok) / n for k in ok[0]["router_cpu"]}
    mine = sum(r["requester_cpu"] for r in ok) / n
    print(f"    routers' CPU time per {what}: " + ", ".join(f"router {k.upper()} {1e6 * v:.0f} us"
                                                     for k, v in sorted(per.items()))
          + f" (the requester's, measurement only: {1e6 * mine:.0f} us)")


def print_requests(res: dict, args) -> None:
    print(f"\n6. Requests and responses (requester at {SRC_IP} in TRD1; responders in TRD2 across the pair, "
          f"fan-out on, or in TRD1 with it: direct), every program a process of its own; rounds: {args.rr_runs}")
    errors = [f"{key[0]} {key[1]}: {r['error']}" for key, rs in res.items() if isinstance(key, tuple)
              for r in rs if "error" in r]
    for e in errors:
        print(f"    FAILED: {e}")
    print(f"  round trip, {args.rr_count} requests one at a time per round, 1 responder (all rounds' requests; "
          "the legs from one clock, CLOCK_MONOTONIC, read in both processes):")
    pooled = {}
    for path in ("direct", "routed"):
        rs = [r for r in res["rtt", path] if "rtt" in r]
        pooled[path] = {k: [x for r in rs for x in r[k]] for k in ("rtt", "request_leg", "response_leg")}
    if all(pooled[p]["rtt"] for p in pooled):
        for label, path in (("direct (one TRD)", "direct"), ("across the pair", "routed")):
            v = pooled[path]
            print(f"    {label:22s} p50 {_ms(statistics.median(v['rtt']))}   p99 {_ms(_pct(v['rtt'], 0.99))}"
                  f"   max {_ms(max(v['rtt']))}   (p50 request leg {_ms(statistics.median(v['request_leg']))}, "
                  f"response leg {_ms(statistics.median(v['response_leg']))})")
        d, r = pooled["direct"]["rtt"], pooled["routed"]["rtt"]
        print(f"    ratio routed/direct    p50 {statistics.median(r) / statistics.median(d):6.2f}x"
              f"     p99 {_pct(r, 0.99) / _pct(d, 0.99):6.2f}x")
        _print_cpu(res["rtt", "routed"], "rtt", "round trip")
    print(f"  responses per second, {args.rr_rate_count} requests to {args.rr_responders} responders, at most "
          f"{args.rr_window} outstanding (best round):")
    best = {}
    for path in ("direct", "routed"):
        rs = [r for r in res["rate", path] if "responses" in r]
        if rs:
            best[path] = max(rs, key=lambda r: r["responses"] / r["seconds"])
    if len(best) == 2:
        rates = {}
        for label, path in (("direct (one TRD)", "direct"), ("across the pair", "routed")):
            v = best[path]
            rates[path] = v["responses"] / v["seconds"]
            every = " ".join(f"{r['responses'] / r['seconds']:.0f}" for r in res["rate", path] if "responses" in r)
            print(f"    {label:22s} {rates[path]:9.0f} responses/s  ({v['responses']} in {v['seconds']:.3f} s; "
                  f"rounds: {every})")
        print(f"    ratio routed/direct    {rates['routed'] / rates['direct']:6.3f}x")
        _print_cpu(res["rate", "routed"], "responses", "response")
    c = res["counters"]
    print("    routers over the section: " + ", ".join(f"{k} {v}" for k, v in c.items()))
