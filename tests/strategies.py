"""Hypothesis strategies that build every kind of LBMR packet object.

Used by the round-trip, fast-path, tshark and fuzz tests. Strategies build
objects (never bytes), so each test encodes them with the codec under test.
"""

from __future__ import annotations

from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_proto import ext as E
from lbmr_proto import lbmc as C

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
i32 = st.integers(-(2**31), 2**31 - 1)
ipv4 = st.tuples(u8, u8, u8, u8).map(lambda t: ".".join(map(str, t)))
b8 = st.binary(min_size=8, max_size=8)
# printable ASCII names (what UM topics are in practice), 1..60 chars
name = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60)
long_name = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=200, max_size=255)
topic = st.one_of(name, name, name, long_name)


def _fixed(cls):
    """Strategy for a Fixed record: each field drawn by its struct code."""
    kinds = {"B": u8, "H": u16, "I": u32, "i": i32, "Q": st.integers(0, 2**64 - 1)}
    import re

    codes = re.findall(r"\d*[a-zA-Z]", cls._FMT)
    args = []
    for fname, code in zip(cls._NAMES, codes, strict=True):
        if fname in cls._IPS:
            args.append(ipv4)
        elif code.endswith("s"):
            n = int(code[:-1])
            args.append(st.binary(min_size=n, max_size=n))
        else:
            args.append(kinds[code])
    return st.builds(cls, *args)


TIR_OPTION_CLASSES = [c for c in L.topts.TIR_OPTION_TYPES.values() if c is not L.UmqQueueInfoOption]
tir_option = st.one_of(
    *[_fixed(c) for c in TIR_OPTION_CLASSES],
    st.builds(L.UmqQueueInfoOption, u16, name),
    st.builds(L.UnknownTirOption, st.integers(0x0F, 0xFF), u16, st.binary(max_size=20)),
)
tir_options = st.none() | st.lists(tir_option, max_size=4)

transport = st.one_of(
    _fixed(L.TcpTransport), _fixed(L.TcpSessionTransport), _fixed(L.LbtruTransport),
    _fixed(L.LbtruSessionTransport), _fixed(L.LbtrmTransport), _fixed(L.LbtipcTransport),
    _fixed(L.LbtsmxTransport), _fixed(L.LbtrdmaTransport),
    st.builds(L.UnknownTransport, st.sampled_from([0x02, 0x11, 0x08, 0x7F]), st.binary(max_size=24)),
)
tir = st.builds(L.TIR, topic, transport, u16, u32, tir_options)
tqr = st.builds(L.TQR, topic)
wc_tqr = st.builds(L.WcTQR, name, st.sampled_from([1, 2]))

packet_option = st.one_of(
    *[_fixed(c) for c in L.popts.PACKET_OPTION_TYPES.values()],
    st.builds(L.UnknownPacketOption, st.integers(0x85, 0xFF), u16, st.binary(max_size=12)),
)
packet_options = st.none() | st.lists(packet_option, max_size=4)
version = st.sampled_from([0, 1])


@st.composite
def normal(draw):
    return L.Packet(0, draw(version), tqrs=draw(st.lists(tqr, max_size=4)),
                    tirs=draw(st.lists(tir, max_size=4)), options=draw(packet_options))


@st.composite
def wc(draw):
    return L.Packet(1, draw(version), wc_tqrs=draw(st.lists(wc_tqr, min_size=1, max_size=3)),
                    tirs=draw(st.lists(tir, max_size=2)), options=draw(packet_options))


@st.composite
def keepalive(draw):
    return L.Packet(draw(st.sampled_from([0, 2, 3])), draw(version), options=draw(packet_options))


tmr = st.builds(L.TMR, name, st.sampled_from([0, 1]), st.sampled_from([0, 0x80, 0x40, 0x20, 0xC0]))


@st.composite
def topic_mgmt(draw):
    tmb = L.TopicMgmtBlock(draw(st.lists(tmr, max_size=4)))
    return L.Packet(4, draw(version), tmb=tmb, options=draw(packet_options))


qir = st.builds(
    L.QIR, name, name, u32, u32, u32, tir_options,
    st.lists(_fixed(L.QirGroup), max_size=3), st.lists(_fixed(L.QirQueue), max_size=3),
)


@st.composite
def queue_res(draw):
    return L.Packet(6, draw(version), qqrs=draw(st.lists(st.builds(L.QQR, name), max_size=3)),
                    qirs=draw(st.lists(qir, max_size=3)), options=draw(packet_options))


pser_option = st.one_of(
    st.builds(E.PserOption, st.sampled_from([0, 1]), b8),
    st.builds(E.PserOption, st.integers(2, 255), st.just(bytes(8)), st.binary(max_size=10)),
)
pser = st.builds(
    E.Pser, name, st.sampled_from([0, 1]), st.integers(0, 0x7FFF), ipv4, ipv4, u32, u32, u16, u16,
    st.booleans(), st.none() | st.lists(pser_option, max_size=3), u16,
)


@st.composite
def qmgmt(draw):
    t = draw(st.integers(1, 8))
    q = E.Qmgmt(t, draw(u8) & ~0x40, draw(st.binary(min_size=20, max_size=20)), draw(u32), draw(u32),
                draw(ipv4), draw(u16), draw(u16), draw(u16), draw(u16))
    if t == E.QMGMT_IL:
        q.highest_rcr_tsp = draw(u32)
        q.instances = draw(st.lists(_fixed(E.QmgmtInstance), max_size=3))
        q.dep16 = 0
    elif t == E.QMGMT_EC:
        q.queue_new_ver = draw(u32)
    elif t == E.QMGMT_EV:
        q.highest_rcr_tsp, q.age = draw(u32), draw(u32)
    elif t == E.QMGMT_QRO:
        q.highest_rcr_tsp = draw(u32)
    q.queue_name = draw(st.none() | name)
    q.queue_name_nul = draw(st.booleans())
    return q


ctxinfo = st.builds(E.CtxInfo, u16.map(lambda f: f & ~1), u8, u16, ipv4, b8, st.none() | name, st.booleans())
trreq = st.builds(E.TopicResRequest, u16)
tnwg_option = st.one_of(
    st.builds(E.TnwgOption, st.just(0), u16, instance=b8),
    st.builds(E.TnwgOption, st.just(1), u16, port=u16, res=u16, ip=ipv4),
    st.builds(E.TnwgOption, st.just(2), u16, domain_id=u32),
    st.builds(E.TnwgOption, st.just(3), u16, name=name, name_nul=st.booleans()),
    st.builds(E.TnwgOption, st.integers(4, 255), u16, data=st.binary(max_size=8)),
)
interest = st.builds(E.InterestRecord, name, u8, u8, u32, st.booleans())
tnwg = st.one_of(
    st.builds(E.Tnwg, st.just(0), u16, st.none(), st.lists(interest, max_size=3)),
    st.builds(E.Tnwg, st.just(1), u16, st.none(), hop_count=u8, ctx_reserved=u8, flags1=u32,
              flags2=u32, options=st.lists(tnwg_option, max_size=3)),
    st.builds(E.Tnwg, st.just(2), u16, st.none(), options=st.lists(tnwg_option, max_size=3)),
)
route = st.builds(E.RemoteDomainRoute, st.lists(u32, max_size=5), ipv4, u16, u16, st.none())
rctx_option = st.one_of(
    st.builds(E.RctxOption, st.just(1), u16, domain_id=u32, ip=ipv4, port=u16, res=u16),
    st.builds(E.RctxOption, st.just(2), u16, instance=b8),
    st.builds(E.RctxOption, st.just(3), u16, domain_id=u32),
    st.builds(E.RctxOption, st.just(4), u16, name=name, name_nul=st.booleans()),
    st.builds(E.RctxOption, st.integers(5, 255), u16, data=st.binary(max_size=8)),
)
rctxinfo = st.builds(
    E.RemoteCtxInfo, st.lists(st.builds(E.RctxRecord, u16, st.lists(rctx_option, max_size=3)), max_size=3),
    u16, st.none(),
)
unknown_ext = st.builds(E.UnknownExt, st.integers(8, 255), st.binary(min_size=2, max_size=16))
ext_record = st.one_of(pser, qmgmt(), ctxinfo, trreq, tnwg, route, rctxinfo, unknown_ext)


@st.composite
def ext(draw):
    return L.Packet(7, draw(version), ext=draw(ext_record), options=draw(packet_options))


packet = st.one_of(normal(), wc(), keepalive(), topic_mgmt(), queue_res(), ext())


# --------------------------------------------------------------------------- LBMC messages

lbmc_header = st.one_of(
    *[_fixed(c) for c in C.HEADER_TYPES.values()],
    st.builds(C.UnknownHeader, st.integers(0x02, 0xFE).filter(lambda c: c not in C.HEADER_TYPES),
              st.binary(min_size=2, max_size=30)),
)


LBMC_KINDS = tuple(sorted(C.KIND_NAMES))


@st.composite
def lbmc_message(draw, header=lbmc_header):
    kind = draw(st.sampled_from(LBMC_KINDS))
    headers = tuple(draw(st.lists(header, max_size=4)))
    end = draw(st.sampled_from([C.NHDR_DATA, C.NHDR_NONE]))
    payload = draw(st.binary(max_size=40)) if end == C.NHDR_DATA else b""
    if kind in C.DATA_KINDS:
        return C.Message(kind, draw(u32), draw(u32), payload, headers, end)
    return C.Message(kind, 0, 0, payload, headers, end)
