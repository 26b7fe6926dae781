"""lbmr_proto.lbmc: LBMC messages, their header chain and the LBT-TCP stream framer.

Layouts are stated here from Wireshark's packet-lbmc.c (byte by byte, not
through the codec's structs); tests/test_lbmc_tshark.py has tshark judge the
same bytes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbmr_proto as L
from lbmr_proto import lbmc as C
from lbmr_proto import lbmc_stream

from . import strategies as S

# ----------------------------------------------------------------- layouts


def test_data_message_layout():
    b = C.data_message(0x01020304, 0x0A0B0C0D, b"xyz")
    assert b == bytes.fromhex("00 00 000f 01020304 0a0b0c0d") + b"xyz"
    m = C.decode(b)
    assert (m.kind, m.tidx, m.sqn, m.payload, m.headers, m.end) == (C.MESSAGE, 0x01020304, 0x0A0B0C0D,
                                                                    b"xyz", (), C.NHDR_DATA)


def test_control_message_with_tcp_session_id():
    b = C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0x8000, 0xDEADBEEF),)))
    #                ver/type next msglen | next  len  flags  sid
    assert b == bytes.fromhex("08 6b 000c" "ff 08 8000 deadbeef")
    assert C.decode(b).header(C.TcpSidHeader).session_id == 0xDEADBEEF


def test_header_layouts_byte_by_byte():
    cases = [
        (C.FragmentHeader(0x8000, 7, 100, 5000), "01", "0110 8000 00000007 00000064 00001388"),
        (C.RequestHeader(0x80, 0, 9, 14391, 0, "10.1.2.3"), "04", "0010 80 00 00000009 3837 0000 0a010203"),
        (C.SsfInitHeader(0x40, 1, 2, 3, 4, 0, "1.2.3.4"), "10", "0014 40 01 00000002 00000003 0004 0000 01020304"),
        (C.SsfCreqHeader(0x80, 1, 2, 3, 4), "11", "0010 80 01 00000002 00000003 00000004"),
        (C.UmeRxReqHeader(0x4001, 1, 2, 3, 4, 5, 0, "5.6.7.8"), "15",
         "001c 4001 00000001 00000002 00000003 00000004 0005 0000 05060708"),
        (C.DomainHeader(0x4000, 9), "43", "0008 4000 00000009"),
        (C.OriginDomainHeader(0, 10), "4a", "0008 0000 0000000a"),
        (C.StreamHeader(0, 1, 2, bytes(range(8))), "4b", "0014 0000 00000001 00000002 0001020304050607"),
        (C.LateJoinRequestHeader(7, 1, 2, 3, "3.3.3.3", 4, 0, 5, 6, 7), "4e",
         "0024 0007 00000001 00000002 00000003 03030303 0004 0000 00000005 00000006 00000007"),
        (C.DestinationHeader(0, 1, "1.1.1.1", 2, 3, 4, "2.2.2.2", 5, 0), "64",
         "001c 0000 00000001 01010101 0002 0003 00000004 02020202 0005 0000"),
        (C.TcpSidHeader(0, 0x11223344), "6b", "0008 0000 11223344"),
        (C.UnknownHeader(0x03, b"\x80\x00ab"), "03", "0006 8000 6162"),
    ]
    for h, code, body in cases:
        b = C.encode(C.Message(C.CONTROL, headers=(h,)))
        hx = code + body.replace(" ", "")
        # the chain's header ends with NONE: its first byte is 0xff
        want = bytes.fromhex("08") + bytes.fromhex(hx[:2]) + (4 + len(hx[2:]) // 2).to_bytes(2, "big") + \
            bytes.fromhex("ff" + hx[4:])
        assert b == want, (h, b.hex())
        assert C.decode(b).headers == (h,)


def test_chain_order_and_next_hdr_links():
    hs = (C.StreamHeader(0, 1, 2, bytes(8)), C.DestinationHeader(), C.RequestHeader(qidx=3))
    b = C.encode(C.Message(C.MESSAGE, 5, 6, b"p", hs))
    assert b[1] == 0x4B  # first header: STREAM
    assert b[12] == 0x64 and b[12 + 20] == 0x04 and b[12 + 20 + 28] == 0x00  # ... then DATA
    m = C.decode(b)
    assert m.headers == hs and m.payload == b"p" and m.header(C.RequestHeader).qidx == 3


def test_defaults_per_kind():
    assert C.Message(C.MESSAGE).end == C.NHDR_DATA and C.Message(C.RETRANS).end == C.NHDR_DATA
    assert C.Message(C.CONTROL).end == C.NHDR_NONE and C.Message(C.EOT).end == C.NHDR_NONE
    assert C.encode(C.Message(C.EOT)) == bytes.fromhex("01ff0004")
    assert C.encode(C.Message(C.RETRANS, 1, 2)) == bytes.fromhex("0a00000c0000000100000002")


def test_exported_from_the_package():
    assert L.lbmc is C and L.LbmcMessage is C.Message and L.LbmcStreamFramer is lbmc_stream.StreamFramer
    assert L.LbmcDecodeError is C.LbmcDecodeError and issubclass(C.LbmcDecodeError, ValueError)
    assert not issubclass(C.LbmcDecodeError, L.LBMRDecodeError)


# ----------------------------------------------------------------- round trip and fuzzing


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(S.lbmc_message())
def test_round_trip(msg):
    b = C.encode(msg)
    assert C.decode(b) == msg
    assert C.encode(C.decode(b)) == b
    assert int.from_bytes(b[2:4], "big") == len(b)


def _outcome(b):
    try:
        m = C.decode(b)
    except C.LbmcDecodeError:  # anything else fails the test
        return None
    return m


@st.composite
def mutated(draw):
    b = bytearray(C.encode(draw(S.lbmc_message())))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 3))
        if op == 0 and b:
            b[draw(st.integers(0, len(b) - 1))] = draw(S.u8)
        elif op == 1 and b:
            del b[draw(st.integers(0, len(b) - 1)):]
        elif op == 2:
            b[draw(st.integers(0, len(b))):0] = draw(st.binary(min_size=1, max_size=6))
        elif b:
            b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
    if draw(st.booleans()) and len(b) >= 4:  # keep msglen consistent, so the chain gets fuzzed
        b[2:4] = len(b).to_bytes(2, "big")
    return bytes(b)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(mutated(), st.binary(max_size=64)))
def test_only_decode_error_escapes(b):
    m = _outcome(b)
    if m is not None:
        assert C.encode(m) == b


BAD = {
    "short": ("0800", 0, "shorter than the 4-byte"),
    "version 1": ("18ff0004", 0, "version 1"),
    "type 3": ("03ff0004", 0, "unknown LBMC message type 0x3"),
    "msglen under data header": ("0000000b" + "00" * 7, 2, "shorter than the 12-byte MESSAGE"),
    "msglen not the length": ("08ff0006" + "00", 2, "msglen 6 but the message has 5 bytes"),
    "header cut": ("086b0005" "ff", 4, "ends at byte 5"),
    "typed header wrong len": ("086b000c" "ff09000000000000", 5, "hdr_len 9, expected 8"),
    "unknown header too short": ("0803000a" "ff0300000000", 5, "hdr_len 3"),
    "header past msglen": ("08030008" "ff060000", 5, "runs past msglen 8"),
    "bytes after NONE": ("08ff0006" "abcd", 4, "2 bytes after a chain that ends with NONE"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejects_malformed_with_offset(case):
    hx, off, why = BAD[case]
    with pytest.raises(C.LbmcDecodeError, match=why) as ei:
        C.decode(bytes.fromhex(hx))
    assert ei.value.offset == off, ei.value


def test_encode_rejects_bad_objects():
    with pytest.raises(L.LBMREncodeError, match="at most 65535"):
        C.encode(C.Message(C.MESSAGE, payload=bytes(65535 - 11)))
    assert len(C.encode(C.Message(C.MESSAGE, payload=bytes(65535 - 12)))) == 65535
    with pytest.raises(L.LBMREncodeError, match="at most 65535"):
        C.data_message(1, 2, bytes(65524))
    with pytest.raises(L.LBMREncodeError):
        C.data_message(2**32, 0, b"")
    with pytest.raises(L.LBMREncodeError, match="not on the wire"):
        C.encode(C.Message(C.CONTROL, 1, 0))
    with pytest.raises(L.LBMREncodeError, match="only DATA carries one"):
        C.encode(C.Message(C.CONTROL, payload=b"x"))
    with pytest.raises(L.LBMREncodeError, match="a known type"):
        C.encode(C.Message(C.CONTROL, headers=(C.UnknownHeader(0x6B, b"\0\0\0\0\0\0"),)))
    with pytest.raises(L.LBMREncodeError, match="4..255"):
        C.encode(C.Message(C.CONTROL, headers=(C.UnknownHeader(0x03, b"\0"),)))
    with pytest.raises(L.LBMREncodeError):
        C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, 2**32),)))
    with pytest.raises(L.LBMREncodeError):
        C.encode(C.Message(C.CONTROL, headers=(C.RequestHeader(ipaddr="1.2.3"),)))
    with pytest.raises(L.LBMREncodeError, match="type 5"):
        C.encode(C.Message(5))


def test_error_pickles_like_the_lbmr_one():
    import pickle

    e = pickle.loads(pickle.dumps(C.LbmcDecodeError(3, "why")))
    assert type(e) is C.LbmcDecodeError and (e.offset, e.reason) == (3, "why")


# ----------------------------------------------------------------- the stream framer


def _stream(n: int) -> tuple[list[bytes], bytes]:
    msgs = [C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, 77),)))]
    msgs += [C.data_message(1, q, bytes([q % 256]) * (q * 37 % 300)) for q in range(n)]
    return msgs, b"".join(msgs)


def _framed_in_pieces(cuts: list[int], take) -> None:
    """Feed a stream to a framer in pieces of the sizes ``cuts`` (over and over)
    with ``take(framer, piece)`` (the messages it gives): every message comes out
    once, whole, in order, and the framer holds only the incomplete one."""
    msgs, stream = _stream(40)
    f = lbmc_stream.StreamFramer()
    got, pos, i = [], 0, 0
    while pos < len(stream):
        piece = stream[pos:pos + cuts[i % len(cuts)]]
        i += 1
        got += take(f, piece)
        pos += len(piece)
        assert f.buffered < 65536 and f.offset + f.buffered == pos
    assert got == msgs and f.buffered == 0 and f.messages == len(msgs) and f.offset == len(stream)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=60))
def test_framer_returns_whole_messages_however_the_stream_is_cut(cuts):
    _framed_in_pieces(cuts, lambda f, piece: f.feed(piece))


def _cut(f: lbmc_stream.StreamFramer, piece: bytes) -> list[bytes]:
    runs = f.cut(piece)
    assert len(runs) <= 2 and all(r.count and r.ends[-1] == len(r.data) for r in runs)
    whole = [r for r in runs if isinstance(r.data, memoryview)]
    assert all(r.data.obj is piece for r in whole)  # not copied
    return [m for r in runs for m in r.messages()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=60))
def test_framer_cut_gives_the_same_messages_as_views_of_what_it_was_fed(cuts):
    _framed_in_pieces(cuts, _cut)


def _received(f: lbmc_stream.StreamFramer, piece: bytes) -> list[bytes]:
    f.receive_buffer(1000)[:len(piece)] = piece
    runs = f.received(len(piece))
    assert len(runs) <= 1 and all(r.data.readonly and r.ends[-1] == len(r.data) for r in runs)
    return [m for r in runs for m in r.messages()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=60))
def test_framer_received_gives_one_run_read_only_whatever_the_reads(cuts):
    _framed_in_pieces(cuts, _received)


def test_framer_received_needs_a_buffer_and_rejects_a_bad_start():
    f = lbmc_stream.StreamFramer()
    with pytest.raises(ValueError):
        f.received(1)
    good = C.data_message(1, 1, b"abc")
    data = good + bytes.fromhex("f0ff0004")
    f.receive_buffer(len(data))[:] = data
    with pytest.raises(C.LbmcDecodeError, match="version 15") as ei:
        f.received(len(data))
    assert ei.value.offset == len(good)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(1, 60)), min_size=1, max_size=8),
       st.lists(st.integers(1, 5000), min_size=1, max_size=20), st.integers(0, 400),
       st.sampled_from([None, 0xFF, 0xF1, 0x13]))
def test_framer_frames_runs_of_alike_messages_as_one_by_one(runs, cuts, bad_at, bad_byte):
    """Mostly messages of one size (framed a run at a time, C-level), now and then
    one of another size or kind, and perhaps a bad start: cut in any pieces, the
    framer gives every message, whole and in order, or raises at the bad start's
    offset."""
    msgs = []
    for q, kind in enumerate(k for k, count in runs for _ in range(count)):
        if kind == 2:
            msgs.append(C.encode(C.Message(C.CONTROL, headers=(C.TcpSidHeader(0, q),))))
        else:
            msgs.append(C.data_message(1, q, bytes([q % 256]) * (100 if kind == 0 else 37)))
    stream = bytearray(b"".join(msgs))
    bad_offset = None
    if bad_byte is not None and bad_at < len(msgs):
        bad_offset = sum(map(len, msgs[:bad_at]))
        stream[bad_offset] = bad_byte  # a version or kind UM does not send
        msgs = msgs[:bad_at]
    stream = bytes(stream)
    f = lbmc_stream.StreamFramer()
    got, pos, i = [], 0, 0
    with pytest.raises(C.LbmcDecodeError) if bad_offset is not None else _no_error() as raised:
        while pos < len(stream):
            piece = stream[pos:pos + cuts[i % len(cuts)]]
            i += 1
            got += [m for r in f.cut(piece) for m in r.messages()]
            pos += len(piece)
    assert got == msgs[:len(got)]
    if bad_offset is None:
        assert got == msgs and f.buffered == 0
    else:  # (the messages of the piece that raised are not given)
        assert raised.value.offset == bad_offset


class _no_error:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_framer_drops_a_receive_buffer_nothing_came_into():
    f = lbmc_stream.StreamFramer()
    m = C.data_message(1, 1, b"abcdef")
    f.receive_buffer(len(m))[:3] = m[:3]
    assert f.received(3) == [] and f.buffered == 3  # an incomplete message: held, no run
    f.receive_buffer(1000)
    assert f.reserved == 3 + 1000
    f.drop_receive_buffer()  # the read got nothing
    assert f.reserved == 0 and f.buffered == 3
    with pytest.raises(ValueError):
        f.received(1)
    f.receive_buffer(1000)[:len(m) - 3] = m[3:]
    (run,) = f.received(len(m) - 3)
    assert run.messages() == [m] and f.reserved == 0 and f.buffered == 0


def test_message_run_of_counts_and_fits():
    run = lbmc_stream.MessageRun.of([b"a" * 10, b"b" * 20, b"c" * 5])
    assert run.data == b"a" * 10 + b"b" * 20 + b"c" * 5 and run.ends == [10, 30, 35] and run.count == 3
    assert [run.fitting(x) for x in (9, 10, 34, 35, 99)] == [0, 1, 2, 3, 3]
    assert run.messages() == [b"a" * 10, b"b" * 20, b"c" * 5]


def test_framer_byte_by_byte_and_in_one_piece():
    msgs, stream = _stream(10)
    f = lbmc_stream.StreamFramer()
    assert [m for i in range(len(stream)) for m in f.feed(stream[i:i + 1])] == msgs
    assert lbmc_stream.StreamFramer().feed(stream) == msgs
    assert lbmc_stream.StreamFramer().feed(memoryview(bytearray(stream))) == msgs


def test_framer_holds_at_most_one_message():
    big = C.data_message(1, 1, bytes(65535 - 12))
    f = lbmc_stream.StreamFramer()
    assert f.feed(big[:-1]) == [] and f.buffered == 65534
    assert f.feed(big[-1:] + big[:3]) == [big] and f.buffered == 3


@pytest.mark.parametrize("head,off,why", [
    (bytes.fromhex("0000000b"), 2, "shorter than the 12-byte"),  # msglen below the data header
    (bytes.fromhex("08ff0003"), 2, "shorter than the 4-byte"),
    (bytes.fromhex("0000"), None, None),  # not enough to judge yet
    (bytes.fromhex("f0ff0004"), 0, "version 15"),
    (bytes.fromhex("10ff000c" + "00" * 8), 0, "version 1"),  # a whole MESSAGE of another version
    (bytes.fromhex("1aff000c" + "00" * 8), 0, "version 1"),  # a whole RETRANS likewise
    (bytes.fromhex("07ff0004"), 0, "unknown LBMC message type"),
])
def test_framer_rejects_a_bad_start_with_the_stream_offset(head, off, why):
    good = C.data_message(1, 1, b"abc")
    for split in range(1, len(good) + len(head)):
        data = good + head
        f = lbmc_stream.StreamFramer()
        if why is None:
            assert f.feed(data[:split]) + f.feed(data[split:]) == [good]
            continue
        with pytest.raises(C.LbmcDecodeError, match=why) as ei:
            f.feed(data[:split])
            f.feed(data[split:])
        assert ei.value.offset == len(good) + off
        g = lbmc_stream.StreamFramer()
        with pytest.raises(C.LbmcDecodeError, match=why) as ei:
            g.cut(data[:split])
            g.cut(data[split:])
        assert ei.value.offset == len(good) + off
        with pytest.raises(C.LbmcDecodeError):  # the stream stays broken
            f.feed(good)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 50))
def test_framer_only_raises_decode_error(data, step):
    f = lbmc_stream.StreamFramer()
    try:
        for i in range(0, len(data), step):
            for m in f.feed(data[i:i + step]):
                assert int.from_bytes(m[2:4], "big") == len(m)
            assert f.buffered < 65536
    except C.LbmcDecodeError:
        pass
