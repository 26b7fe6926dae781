"""The operators' pages against hostile names (issue 25, part 2), in Debian's
headless chromium: a router pair (r1 - r2, processes) where

* a "source" in TRD1 advertises topics with hostile names (TIRs to its lbmrd),
* a "receiver" in TRD2 queries them (TQRs) and hostile wildcard patterns,
* a fake router on r2's spare peer portal, with a hostile name, announces
  hostile router names (TOPOLOGY), hostile interest (INTEREST, topics and
  patterns) and hostile sources (ADVERTISEMENT),

the names being markup (``<script>``, ``"><img onerror>``, ``</style>``),
right-to-left overrides, 255 bytes without a space, and bytes that are not
UTF-8. r2's page must show each as text (its printable form), run no
script (checked in the browser: no flag set by a handler, no dialog, no
element made from a name, no CSP violation), and keep its layout (no
overlapping blocks, no sideways scrolling) at both sizes.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import pytest

import lbmr_proto as L
from lbmr_runtime.monitor import visible
from tests.browser import (
    PAGE_SIZES,
    MonitorPage,
    check_page_basics,
    headless_chromium,
)
from tests.helpers import wait_http
from tests.router_chain import RouterChain

WAIT = 60.0

BAD_UTF8 = b"\xff\xfe<b>not utf-8</b>\xc3".decode("utf-8", "surrogateescape")
#: names as any application or peer may choose them (each at most 255 bytes)
HOSTILE = [
    "<script>window.__pwned='script'</script>",
    "\"><img src=x onerror=\"window.__pwned='img'\">",
    "</style><style>body{display:none}</style>",
    "</td></tr></table><h1 id=injected>big</h1>",
    "md.\u202egnp.exe\u202c.rtl",
    "x" * 242 + "<b>255</b>",
    BAD_UTF8,
]
TOPICS = [f"t{i}.{h}" for i, h in enumerate(HOSTILE)]
PATTERNS = ["^<script>alert(1)</script>.*", "\u202e(evil)|<img src=x onerror=alert(2)>"]
PEER_TOPICS = [f"p{i}.{h}" for i, h in enumerate(HOSTILE)]
assert max(len(t.encode("utf-8", "surrogateescape")) for t in TOPICS + PEER_TOPICS) == 255
FAKE_NAME = "<img src=x onerror=\"window.__pwned='name'\">\u202eretuor"
MANY_PEERS = 1500  # more peers of 255 bytes in its TOPOLOGY (the map holds 2048 peers in all)
FAKE_PEERS = ["</script><script>window.__pwned='peer'</script>", "y" * 255, BAD_UTF8[:20] + "q"]

#: the fake router (a process): handshake on r2's spare peer portal as FAKE_NAME in domain 7,
#: then every half second a TOPOLOGY naming FAKE_PEERS and MANY_PEERS more, INTEREST in PEER_TOPICS and
#: PATTERNS, and an ADVERTISEMENT of each of TOPICS (a source behind it)
FAKE_ROUTER = r'''
import sys, json, trio
from router import peerlink as P
port = int(sys.argv[1])
arg = json.loads(bytes.fromhex(sys.argv[2]))
dec = lambda h: bytes.fromhex(h).decode("utf-8", "surrogateescape")
name, peers, topics, patterns, adverts = dec(arg["name"]), [dec(x) for x in arg["peers"]], \
    [dec(x) for x in arg["topics"]], [dec(x) for x in arg["patterns"]], [dec(x) for x in arg["adverts"]]

async def main():
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    caps = P.DEFAULT_CAPABILITIES | P.Capability.ROUTING
    conn = P.PeerConnection("initiator", P.RouterIdentity(name, (7,), capabilities=int(caps)),
                            keepalive_interval=1.0, dead_after=30.0)
    now = trio.current_time
    lock = trio.Lock()  # the reader's answers and the sender's frames, one at a time

    async def send(data):
        async with lock:
            await stream.send_all(data)

    await send(conn.start(now()))
    up = trio.Event()

    async def reader():
        while True:
            data = await stream.receive_some(65536)
            if not data:
                sys.exit(0)
            for ev in conn.receive_data(data, now()):
                if isinstance(ev, P.Connected):
                    up.set()
                elif isinstance(ev, P.Terminated):
                    print("terminated", ev, flush=True)
                    sys.exit(1)
            out = conn.data_to_send()
            if out:
                await send(out)

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await up.wait()
        print("connected", flush=True)
        seq = 1
        while True:
            # 255 bytes each, sorted after the hostile ones (the page shows the first 64)
            many = tuple((f"\U0001f600{'z' * 246}{i:05d}", 1) for i in range(arg["many"]))
            frames = [P.Topology(name, seq, 0, ((7, 1),), tuple((p, 1) for p in peers) + (("r2", 1),) + many)]
            action = P.InterestAction.ADD if seq == 1 else P.InterestAction.REFRESH
            frames += [P.Interest(action, t, 7) for t in topics]
            frames += [P.Interest(action, p, 7, P.PatternType.PCRE) for p in patterns]
            if seq == 1:
                frames += [P.Advertisement(t, 7, bytes([i + 1]) * 32, 0, 100 + i, session=0x77)
                           for i, t in enumerate(adverts)]
            for f in frames:
                await send(conn.send(f, now()))
            out, _ = conn.tick(now())
            if out:
                await send(out)
            seq += 1
            await trio.sleep(0.5)

trio.run(main)
'''


def _hex(s: str) -> str:
    return s.encode("utf-8", "surrogateescape").hex()


def api(base: str, what: str) -> dict:
    return json.loads(wait_http(f"{base}/api/{what}"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    c = RouterChain(tmp_path_factory.mktemp("hostile"), 2, spare_acceptors={"r2": 1})
    socks = []
    stop, beat = threading.Event(), None
    try:
        end = time.monotonic() + WAIT

        def until(ok, what):
            while not ok():
                assert time.monotonic() < end, (what, c.log("r2")[-3000:])
                time.sleep(0.2)

        until(lambda: len(api(c.base("r2"), "router")["topology"]["routes"]["items"]) == 2, "the pair's routes")
        arg = json.dumps({"name": _hex(FAKE_NAME), "peers": [_hex(p) for p in FAKE_PEERS],
                          "topics": [_hex(t) for t in PEER_TOPICS], "patterns": [_hex(p) for p in PATTERNS],
                          "adverts": [_hex(t) for t in TOPICS], "many": MANY_PEERS}).encode().hex()
        c.spawn("fake", [sys.executable, "-c", FAKE_ROUTER, str(c.spare_ports["r2"][0]), arg])
        # a source in TRD1 (a listening socket it advertises) and a receiver in TRD2
        src = socket.socket()
        src.bind(("127.0.1.5", 0))
        src.listen()
        ctx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ctx.bind(("127.0.1.5", 0))
        rcv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rcv.bind(("127.0.2.9", 0))
        socks += [src, ctx, rcv]
        port = src.getsockname()[1]
        tirs = L.encode(L.Packet(0, 1, tirs=[L.TIR(t, L.TcpTransport("0.0.0.0", port), 60, 10 + i)
                                             for i, t in enumerate(TOPICS)]))
        tqrs = L.encode(L.Packet(0, 1, tqrs=[L.TQR(t) for t in TOPICS]))
        wc = L.encode(L.Packet(L.PacketType.WC_TQR, 1, wc_tqrs=[L.WcTQR(p, 1) for p in PATTERNS]))

        def proxied() -> set[str]:
            for data, dst in ((tirs, c.lbmrd[1]), (tqrs, c.lbmrd[2]), (wc, c.lbmrd[2])):
                (ctx if dst == c.lbmrd[1] else rcv).sendto(data, dst)
            rows = api(c.base("r2"), "sessions?limit=100")["rows"]
            return {t for r in rows for t in r["topics"]["items"]}

        shown = {visible(t) for t in TOPICS}
        until(lambda: shown <= proxied(), "proxies of every hostile topic at r2")
        until(lambda: FAKE_NAME[:5] in json.dumps(api(c.base("r2"), "router")), "the fake router")

        def source_and_receiver_go_on():  # as long as the module runs: neither the source nor the interest lapses
            while not stop.wait(1.0):
                for data, dst in ((tirs, c.lbmrd[1]), (tqrs, c.lbmrd[2]), (wc, c.lbmrd[2])):
                    (ctx if dst == c.lbmrd[1] else rcv).sendto(data, dst)

        beat = threading.Thread(target=source_and_receiver_go_on, daemon=True)
        beat.start()
        until(lambda: len(api(c.base("r2"), "sessions?limit=100")["rows"]) == 2, "both sessions at r2")
        yield c
    finally:
        stop.set()
        if beat is not None:
            beat.join(5)
        for s in socks:
            s.close()
        c.stop()


browser = headless_chromium  # the fixture


_WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""

_DOM = """() => ({
  pwned: window.__pwned === undefined ? null : String(window.__pwned),
  csp: window.__csp,
  injected: document.querySelectorAll('img, style, iframe, object, embed, h1#injected, b, svg image').length,
  scripts: Array.from(document.scripts).map(s => s.getAttribute('src')),
  bodyShown: getComputedStyle(document.body).display !== 'none',
  text: document.body.textContent,
  svgText: Array.from(document.querySelectorAll('svg.topology title')).map(t => t.textContent).join('\\n'),
})"""


@pytest.mark.parametrize("size", list(PAGE_SIZES))
def test_hostile_names_are_text_and_run_nothing(pair, browser, tmp_path, size):
    p = MonitorPage(browser, pair.base("r2"), size)
    p.page.add_init_script(_WATCH)
    try:
        p.open()
        p.page.wait_for_function("() => document.querySelector('#sessions .tools .info').textContent"
                                 " === '2 in all'")  # two source sessions (TRD1's, the fake's): seven topics each
        p.page.click("#interest summary")  # the interest list unfolded: its names laid out too
        # one more refresh: every table redrawn from fresh data
        mark = p.js("() => document.getElementById('updated').textContent")
        p.page.wait_for_function("m => { const u = document.getElementById('updated');"
                                 " return u.textContent !== m && !u.classList.contains('stale'); }", arg=mark)
        p.screenshot(tmp_path / f"hostile-{size}.png", full_page=True)
        d = p.js(_DOM)
        assert d["pwned"] is None and d["csp"] == [] and p.dialogs == []
        assert d["injected"] == 0
        assert d["scripts"] == ["/static/monitor.js", "/static/router.js"]
        assert d["bodyShown"]
        # every name as its printable text: topics (TIRs, TQRs), patterns (WC TQRs and INTEREST),
        # the fake router's name (handshake) and those it announced (TOPOLOGY)
        for name in TOPICS + PATTERNS + PEER_TOPICS + FAKE_PEERS + [FAKE_NAME]:
            assert visible(name) in d["text"] or visible(name) in d["svgText"], name
        assert "\\xff\\xfe<b>not utf-8</b>\\xc3" in d["text"]
        assert "\\u202e" in d["text"] and "\u202e" not in d["text"]
        assert "t5." + "x" * 242 + "<b>255</b>" in d["text"]
        check_page_basics(p)
    finally:
        p.close()


def test_the_json_carries_printable_names(pair):
    body = wait_http(pair.base("r2") + "/api/router").decode("ascii")  # JSON escapes: ASCII only
    assert len(body) < 256 * 1024  # a router announcing 1,500 peers of 255 bytes: 64 of them shown
    s = json.loads(body)
    fake = [n for n in s["topology"]["nodes"]["items"] if n["name"] == visible(FAKE_NAME)]
    assert len(fake) == 1 and len(fake[0]["peers"]) == 64, fake[0]["peers_total"]
    text = json.dumps(s, ensure_ascii=False)
    assert "\u202e" not in text and not any(0xDC80 <= ord(ch) <= 0xDCFF for ch in text)
    assert visible(FAKE_NAME) in {lk["peer"] for lk in s["links"]}
    rows = json.loads(wait_http(pair.base("r2") + "/api/sessions?q=" + "%3Cscript%3E"))["rows"]
    assert sorted(r["link"] for r in rows) == ["2-from-1", "2-spare-0"], rows  # TRD1's source, the fake's
    assert all(r["topics"]["items"] == [visible(t) for t in TOPICS] for r in rows), rows
    assert json.loads(wait_http(pair.base("r2") + "/api/sessions?q=%3Cnope%3E"))["rows"] == []


# ---------------------------------------------------------------- the printable form, without a browser


def test_visible_escapes_what_is_not_printable_and_nothing_else():
    from lbmr_runtime.monitor import MAX_NAME, page_json

    assert visible("md.prices.EUR/USD <b>&amp;") == "md.prices.EUR/USD <b>&amp;"  # markup is text to the page
    assert visible("caf\u00e9 \u05e9\u05dc\u05d5\u05dd \u65e5\u672c") == "caf\u00e9 \u05e9\u05dc\u05d5\u05dd \u65e5\u672c"
    assert visible(BAD_UTF8) == "\\xff\\xfe<b>not utf-8</b>\\xc3"
    assert visible("a\u202eb\u2066c\u200bd\x00e\x1bf\u2028g") == "a\\u202eb\\u2066c\\u200bd\\u0000e\\u001bf\\u2028g"
    assert visible("a\\xffb") == "a\\\\xffb"  # a backslash in a name cannot fake an escape
    assert visible("\U000e0041") == "\\U000e0041"  # a tag character (invisible)
    long = "y" * (MAX_NAME + 5)
    assert visible(long) == "y" * MAX_NAME + "\u2026"
    data = json.loads(page_json({"\u202ekey": [BAD_UTF8, float("nan"), 3, None], 7: "x"}))
    assert data == {"\\u202ekey": ["\\xff\\xfe<b>not utf-8</b>\\xc3", None, 3, None], "7": "x"}
