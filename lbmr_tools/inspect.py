"""lbmr-inspect: print LBMR (UM topic resolution) packets from captures or live traffic.

One line per LBMR datagram (or one JSON object per line with ``--json``), and
a per-type / per-topic / per-sender summary with ``--stats``. With
``--transport``, also the UM transport datagrams (LBT-RM, LBT-RU, LBT-TCP) and
the LBMC messages inside them; with ``--sessions``, the transport-session
tables (per session, per receiver, per topic). Both decode with
:mod:`lbmr_proto.transport_sessions`, in this one process. See lbmr-inspect(1).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

import click

from lbmr_proto import LBMRDecodeError, decode
from lbmr_proto.capture import (
    LINKTYPE_RAW,
    CaptureError,
    UdpDatagram,
    packet_from_frame,
    read_packets,
    read_udp,
)
from lbmr_proto.constants import LBMR_MC_PORT, LBMRD_PORT
from lbmr_proto.jsonview import packet_dict
from lbmr_proto.packet import TYPE_NAMES, Packet
from lbmr_proto.transport_sessions import (
    NCF_REASONS,
    MessageRecord,
    SessionsState,
    TransportDecoder,
    TransportRecord,
    receiver_rows,
    session_rows,
    topic_rows,
)

DEFAULT_PORTS = frozenset({LBMR_MC_PORT, LBMRD_PORT})
TYPE_CHOICES = sorted(TYPE_NAMES.values())
#: record kinds of --transport (datagrams, TCP segments, LBMC messages); ERROR is shared
TRANSPORT_KINDS = ["DATA", "SM", "NAK", "NCF", "ACK", "CREQ", "RST", "SYN", "FIN", "SEGMENT",
                   "MESSAGE", "RETRANS", "PRORX", "CONTROL", "EOT"]


def _addr(t) -> str:
    """Short text of a transport's address fields."""
    n = t.NAME
    if n == "LBTRM":
        return f"{t.ip}:{t.src_ucast_port} grp {t.mcast_group}:{t.dest_port} sess {t.session_id:#x}"
    if n in ("LBTIPC", "LBTSMX"):
        return f"host {t.host_id:#x} xport {t.xport_id} sess {t.session_id:#x}"
    if n == "UNKNOWN":
        return f"type {t.type_code:#04x} {len(t.data)} bytes"
    sess = getattr(t, "session_id", None)
    return f"{t.ip}:{t.port}" + ("" if sess is None else f" sess {sess:#x}")


def describe(pkt: Packet) -> str:
    """One human-readable line for a decoded packet (without time and addresses)."""
    parts = [f"{pkt.type_name} v{pkt.version}"]
    for q in pkt.tqrs:
        parts.append(f"TQR '{q.topic}'")
    for w in pkt.wc_tqrs:
        parts.append(f"WC-TQR {'PCRE' if w.pattern_type == 1 else 'REGEX' if w.pattern_type == 2 else w.pattern_type} '{w.pattern}'")
    for t in pkt.tirs:
        opts = "" if not t.options else " [" + ",".join(type(o).__name__.removesuffix("Option") for o in t.options) + "]"
        parts.append(f"TIR '{t.topic}' {t.transport.NAME} {_addr(t.transport)} idx {t.index}{opts}")
    if pkt.tmb is not None:
        for m in pkt.tmb.tmrs:
            parts.append(f"TMR {'use' if m.type == 1 else 'leave' if m.type == 0 else m.type} '{m.name}' flags {m.flags:#04x}")
    for q in pkt.qqrs:
        parts.append(f"QQR '{q.queue}'")
    for q in pkt.qirs:
        parts.append(f"QIR '{q.queue}' topic '{q.topic}' id {q.queue_id}")
    if pkt.ext is not None:
        parts.append(f"{type(pkt.ext).__name__} {packet_dict(pkt)['ext']}")
    if pkt.options:
        parts.append("opts " + ",".join(type(o).__name__.removesuffix("Option") for o in pkt.options))
    return "; ".join(parts)


def topics_of(pkt: Packet) -> list[str]:
    """Every topic, pattern, TMR name and queue name a packet carries."""
    out = [q.topic for q in pkt.tqrs] + [w.pattern for w in pkt.wc_tqrs] + [t.topic for t in pkt.tirs]
    if pkt.tmb is not None:
        out += [m.name for m in pkt.tmb.tmrs]
    out += [q.queue for q in pkt.qqrs] + [q.topic for q in pkt.qirs]
    return out


def _from_scapy(p, frame, IP, UDP) -> UdpDatagram:  # noqa: N803
    ip = p[IP]
    udp = p[UDP]
    return UdpDatagram(float(p.time), ip.src, udp.sport, ip.dst, udp.dport, bytes(udp.payload), frame, -1)


def _sniff_iter(iface: str, count: int | None, *, transport: bool = False) -> Iterator:
    """Yield sniffed datagrams as they arrive (AsyncSniffer + queue, bounded);
    with ``transport``, also TCP segments and ICMP errors (as :func:`read_packets`)."""
    import queue

    from scapy.all import IP, UDP, AsyncSniffer

    q: queue.Queue = queue.Queue(maxsize=10000)
    state = {"frame": 0}

    def on_packet(p):
        if IP in p and (transport or UDP in p):
            state["frame"] += 1
            if transport:
                item = packet_from_frame(float(p.time), LINKTYPE_RAW, bytes(p[IP]), frame_number=state["frame"])
                if item is None:
                    return
            else:
                item = _from_scapy(p, state["frame"], IP, UDP)
            try:
                q.put_nowait(item)
            except queue.Full:
                pass  # a flood must not grow memory without bound

    sniffer = AsyncSniffer(iface=iface, filter="udp or tcp or icmp" if transport else "udp", prn=on_packet,
                           store=False)
    sniffer.start()
    try:
        n = 0
        while count is None or n < count:
            try:
                yield q.get(timeout=0.5)
                n += 1
            except queue.Empty:
                if not sniffer.running:
                    return
    finally:
        if sniffer.running:
            sniffer.stop()


class Stats:
    """Counters for ``--stats`` (like the vendor's TR sniffer summary)."""

    def __init__(self) -> None:
        self.types: Counter[str] = Counter()
        self.tqr_topics: Counter[str] = Counter()
        self.tir_topics: Counter[str] = Counter()
        self.wc_patterns: Counter[str] = Counter()
        self.senders: Counter[str] = Counter()
        self.sender_bytes: Counter[str] = Counter()
        self.errors = 0
        self.packets = 0

    def add(self, d: UdpDatagram, pkt: Packet | None) -> None:
        src = f"{d.src}:{d.sport}"
        self.packets += 1
        self.senders[src] += 1
        self.sender_bytes[src] += len(d.payload)
        if pkt is None:
            self.errors += 1
            self.types["ERROR"] += 1
            return
        self.types[pkt.type_name] += 1
        self.tqr_topics.update(q.topic for q in pkt.tqrs)
        self.tir_topics.update(t.topic for t in pkt.tirs)
        self.wc_patterns.update(w.pattern for w in pkt.wc_tqrs)

    def as_dict(self) -> dict:
        topics = sorted(set(self.tqr_topics) | set(self.tir_topics))
        return {
            "packets": self.packets,
            "decode_errors": self.errors,
            "types": dict(self.types.most_common()),
            "topics": {t: {"tqrs": self.tqr_topics[t], "tirs": self.tir_topics[t]} for t in topics},
            "wc_patterns": dict(self.wc_patterns.most_common()),
            "senders": {s: {"packets": n, "bytes": self.sender_bytes[s]} for s, n in self.senders.most_common()},
        }

    def render(self) -> str:
        d = self.as_dict()
        lines = [f"{d['packets']} LBMR datagrams, {d['decode_errors']} undecodable", "", "By type:"]
        lines += [f"  {k:<12} {v:>10}" for k, v in d["types"].items()]
        lines += ["", f"By topic ({len(d['topics'])}):", f"  {'TQRs':>8} {'TIRs':>8}  topic"]
        for t, c in sorted(d["topics"].items(), key=lambda kv: -(kv[1]["tqrs"] + kv[1]["tirs"])):
            lines.append(f"  {c['tqrs']:>8} {c['tirs']:>8}  {t}")
        if d["wc_patterns"]:
            lines += ["", "Wildcard patterns:"] + [f"  {v:>8}  {k}" for k, v in d["wc_patterns"].items()]
        lines += ["", f"By sender ({len(d['senders'])}):", f"  {'packets':>8} {'bytes':>10}  sender"]
        lines += [f"  {c['packets']:>8} {c['bytes']:>10}  {s}" for s, c in d["senders"].items()]
        return "\n".join(lines)


def _ts_text(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, ValueError, OSError):  # a corrupt or exotic timestamp
        return f"{ts:.6f}s"


def _printable(text: str) -> str:
    """Names keep undecodable bytes as surrogates; show them as \\xNN."""
    if text.isascii():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_SURROGATE = re.compile(r"\\udc([89a-f][0-9a-f])")


def _json_line(obj: dict) -> str:
    """One JSON line; undecodable name bytes (lone surrogates, which strict
    JSON readers reject) are written as the text \\xNN."""
    line = json.dumps(obj, separators=(",", ":"))
    if "\\udc" in line:
        line = _SURROGATE.sub(r"\\\\x\1", line)
    return line


def run(datagrams: Iterable[UdpDatagram], ports: frozenset[int], *, as_json: bool,
        topic_re: re.Pattern | None, types: set[str], stats: Stats | None, limit: int | None,
        out) -> int:
    """Decode, filter and print; returns the number of LBMR datagrams shown."""
    shown = 0
    for d in datagrams:
        if d.sport not in ports and d.dport not in ports:
            continue
        try:
            pkt: Packet | None = decode(d.payload)
            err = None
        except LBMRDecodeError as e:
            pkt, err = None, str(e)
        if types and (pkt.type_name if pkt is not None else "ERROR") not in types:
            continue
        if topic_re is not None and (pkt is None or not any(topic_re.search(t) for t in topics_of(pkt))):
            continue
        shown += 1
        if stats is not None:
            stats.add(d, pkt)
        elif as_json:
            obj = {"ts": d.ts, "src": f"{d.src}:{d.sport}", "dst": f"{d.dst}:{d.dport}", "frame": d.frame,
                   "len": len(d.payload)}
            if pkt is None:
                obj.update(error=err, data=d.payload.hex())
            else:
                obj.update(packet_dict(pkt))
            out.write(_json_line(obj) + "\n")
        else:
            what = _printable(describe(pkt)) if pkt is not None else f"ERROR {err}"
            out.write(f"{d.frame:>7} {_ts_text(d.ts)} {d.src}:{d.sport} -> {d.dst}:{d.dport} {what}\n")
        if limit is not None and shown >= limit:
            break
    return shown


def _sqn_list(sqns: tuple[int, ...], most: int = 12) -> str:
    shown = ",".join(str(q) for q in sqns[:most])
    return shown + (f",... ({len(sqns)})" if len(sqns) > most else "")


def describe_record(r: TransportRecord | MessageRecord) -> str:
    """One human-readable line for a transport record (without frame, time and addresses)."""
    if isinstance(r, MessageRecord):
        if r.error:
            return f"  LBMC ERROR {r.error} ({r.msglen} bytes)"
        parts = [f"  LBMC {r.kind}"]
        if r.kind in ("MESSAGE", "RETRANS", "PRORX"):
            parts.append(f"tidx {r.tidx} sqn {r.sqn}" + (f" topic '{_printable(r.topic)}'" if r.topic else ""))
        parts.append(f"{r.msglen} bytes")
        if r.headers:
            parts.append("[" + ",".join(r.headers) + "]")
        if r.fragment[0] >= 0:
            parts.append(f"frag {r.fragment[1]}/{r.fragment[2]} of sqn {r.fragment[0]}")
        if r.retransmission:
            parts.append("(in a retransmission)")
        return " ".join(parts)
    head = f"{r.transport} {r.kind}" + (" (quoted in ICMP port unreachable)" if r.icmp else "")
    if r.error:
        return f"{head} {r.error} ({r.length} bytes) {r.session}".rstrip()
    parts = [head]
    if r.kind == "DATA":
        parts.append(f"sqn {r.sqn} trail {r.trail_sqn}" + (" RX" if r.retransmission else ""))
    elif r.kind == "SM":
        parts.append(f"sqn {r.sqn} lead {r.lead_sqn} trail {r.trail_sqn}" + (" SYN" if r.flags & 0x8000 and
                                                                             r.transport == "LBTRU" else ""))
    elif r.kind == "NAK":
        parts.append(f"{len(r.sqns)} sqns {_sqn_list(r.sqns)}")
    elif r.kind == "NCF":
        parts.append(f"{NCF_REASONS.get(r.reason, r.reason)} trail {r.trail_sqn} {len(r.sqns)} sqns "
                     f"{_sqn_list(r.sqns)}")
    elif r.kind == "ACK":
        parts.append(f"sqn {r.sqn}")
    elif r.transport == "TCP":
        parts.append(f"seq {r.sqn} {r.length} bytes")
    parts.append(r.session)
    return " ".join(parts)


def _record_dict(r: TransportRecord | MessageRecord) -> dict:
    obj = r._asdict()
    obj["record"] = "message" if isinstance(r, MessageRecord) else "transport"
    return obj


class TransportRun:
    """``--transport`` and ``--sessions``: one :class:`TransportDecoder` over every
    capture item. With ``print_lbmr``, LBMR datagrams are shown (or counted by
    ``stats``) as without ``--transport``; with ``print_records``, the transport
    records are printed in capture order among them; both filtered by ``--type``
    and ``--topic``."""

    def __init__(self, ports: frozenset[int], *, as_json: bool, topic_re: re.Pattern | None, types: set[str],
                 print_lbmr: bool, print_records: bool, out) -> None:
        self.decoder = TransportDecoder(lbmr_ports=ports)
        self.ports = ports
        self.as_json, self.topic_re, self.types = as_json, topic_re, types
        self.print_lbmr, self.print_records = print_lbmr, print_records
        self.out = out

    def _wanted(self, r) -> bool:
        if self.types and r.kind not in self.types:
            return False
        if self.topic_re is None:
            return True
        if isinstance(r, MessageRecord):
            return bool(r.topic) and self.topic_re.search(r.topic) is not None
        s = self.decoder.state.sessions.get(r.session)
        return s is not None and any(self.topic_re.search(t) for t in s.topics.values())

    def run(self, items: Iterable, stats: Stats | None, limit: int | None) -> int:
        """Decode, filter and print; returns the number of records (and LBMR datagrams) shown."""
        shown = 0
        for item in items:
            if limit is not None and shown >= limit:
                break
            if isinstance(item, UdpDatagram) and (item.sport in self.ports or item.dport in self.ports):
                self.decoder.feed(item)
                if self.print_lbmr:
                    shown += run((item,), self.ports, as_json=self.as_json, topic_re=self.topic_re,
                                 types=self.types, stats=stats, limit=None, out=self.out)
                continue
            for r in self.decoder.feed(item):
                if not self.print_records or not self._wanted(r) or (limit is not None and shown >= limit):
                    continue
                shown += 1
                if self.as_json:
                    self.out.write(_json_line(_record_dict(r)) + "\n")
                elif isinstance(r, MessageRecord):
                    self.out.write(f"{r.frame:>7} {describe_record(r)}\n")
                else:
                    self.out.write(f"{r.frame:>7} {_ts_text(r.ts)} {r.src}:{r.sport} -> {r.dst}:{r.dport} "
                                   f"{describe_record(r)}\n")
        return shown


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def sessions_dict(state: SessionsState) -> dict:
    """The three tables (and the bad-input counts) as one JSON-ready object."""
    return {"sessions": [r._asdict() for r in session_rows(state)],
            "receivers": [r._asdict() for r in receiver_rows(state)],
            "topics": [r._asdict() for r in topic_rows(state)],
            "errors": dict(state.errors), "overflow": dict(state.overflow)}


def render_sessions(state: SessionsState) -> str:
    """The session table for people: a block per session, its receivers and topics."""
    rows = session_rows(state)
    recv: dict[str, list] = {}
    for r in receiver_rows(state):
        recv.setdefault(r.session, []).append(r)
    topics: dict[str, list] = {}
    for t in topic_rows(state):
        topics.setdefault(t.session, []).append(t)
    lines = [f"{len(rows)} transport sessions"]
    for s in rows:
        lines += ["", f"{s.source}  ({'TIR' if s.from_tir else 'no TIR: found by its headers'})"]
        if s.source_contexts:
            lines.append(f"  source context: {', '.join(s.source_contexts)}")
        if s.originals or s.retransmissions:
            lines.append(f"  {s.originals} original datagrams ({s.original_bytes} bytes), {s.retransmissions} "
                         f"retransmissions ({s.retransmission_bytes} bytes), {s.rate_bps:.0f} bytes/s")
            lines.append(f"  first {_ts_text(s.first_ts)}  last original {_ts_text(s.last_original_ts)}  "
                         f"last {_ts_text(s.last_ts)}")
        ncfs = ", ".join(f"{name} {n}" for name, n in zip(NCF_REASONS.values(), (
            s.ncf_no_retry, s.ncf_ignored, s.ncf_rx_delay, s.ncf_shed), strict=True) if n)
        lines.append(f"  NAKs {s.nak_packets} ({s.nak_entries} entries, {s.naked_sqns} sqns); "
                     f"NCFs {ncfs or 0}; session messages {s.session_messages}; ICMP errors {s.icmp_errors}"
                     + (f" (to the source; {s.receiver_icmp_errors} from receivers gone)"
                        if s.receiver_icmp_errors else ""))
        if s.control:
            lines.append("  control: " + ", ".join(f"{k} {n}" for k, n in s.control))
        lines.append(f"  receivers ({len(s.receivers)}):")
        for r in recv.get(s.session, []):
            desc = f"    {r.receiver} {r.kind}: {r.packets} packets"
            if r.nak_packets:
                desc += (f", NAKs {r.nak_packets} ({r.nak_entries} entries, {r.naked_sqns} sqns), loss ~"
                         f"{r.loss_estimate:.2%}, recovery p50 {_ms(r.recovery_p50)} max {_ms(r.recovery_max)}, "
                         f"{r.outstanding_count} never retransmitted")
                if r.outstanding:
                    desc += f" ({_sqn_list(r.outstanding)})"
            if r.zero_windows:
                desc += f", zero windows {r.zero_windows}"
            if r.resets:
                desc += f", resets {r.resets}"
            lines.append(desc)
        lines += [f"    {c[4:]} (context whose queries resolved here)" for c in s.receivers if c.startswith("ctx:")]
        lines.append("  topics:")
        for t in topics.get(s.session, []):
            name = f"'{_printable(t.topic)}'" if t.topic else "(no TIR)"
            lines.append(f"    tidx {t.tidx} {name}: {t.messages} messages, {t.rx_messages} retransmitted")
    if state.errors:
        lines += ["", "Bad input: " + ", ".join(f"{k} {n}" for k, n in sorted(state.errors.items()))]
    if state.overflow:
        lines += ["", "Not kept (bounds): " + ", ".join(f"{k} {n}" for k, n in sorted(state.overflow.items()))]
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("captures", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--live", "iface", metavar="IFACE", help="Sniff live traffic on IFACE through scapy (needs root).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per LBMR datagram per line.")
@click.option("--port", "ports", type=click.IntRange(1, 65535), multiple=True, metavar="N",
              help="Also treat UDP port N as LBMR (repeatable). Always: 12965, 15380.")
@click.option("--topic", "topic", metavar="REGEX", help="Only packets with a topic/pattern/queue matching REGEX.")
@click.option("--type", "types", type=click.Choice(TYPE_CHOICES + TRANSPORT_KINDS + ["ERROR"], case_sensitive=False),
              multiple=True, help="Only packets of this type (repeatable); ERROR = undecodable. With "
              "--transport also DATA, SM, NAK, NCF, ACK, CREQ, RST, SYN, FIN, SEGMENT (TCP) and the LBMC kinds "
              "MESSAGE, RETRANS, PRORX, CONTROL, EOT.")
@click.option("--stats", is_flag=True, help="Print counts per type, per topic and per sender instead of packets.")
@click.option("--transport", is_flag=True,
              help="Also print UM transport traffic: LBT-RM, LBT-RU and LBT-TCP datagrams (NAKs, NCFs, "
              "retransmissions, session messages, ICMP errors quoting them) and the LBMC messages inside, found "
              "from the TIRs and the headers (no port settings needed).")
@click.option("--sessions", is_flag=True,
              help="Print the transport-session tables at the end: per session, per receiver, per topic.")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Stop after N LBMR datagrams (with --transport: "
              "N records shown).")
def main(captures, iface, as_json, ports, topic, types, stats, transport, sessions, count):
    """Print the LBMR (Ultra Messaging topic resolution) datagrams in CAPTURES
    (pcap or pcapng files) or, with --live, on a network interface.

    \b
    Examples:
      lbmr-inspect trace.pcapng
      lbmr-inspect --json --topic '^md\\.' trace.pcap | jq .tirs
      lbmr-inspect --stats trace.pcap
      sudo lbmr-inspect --live eth0 --type NORMAL
      lbmr-inspect --transport --type NAK --type NCF trace.pcap
      lbmr-inspect --sessions trace.pcap
    """
    if not captures and not iface:
        raise click.UsageError("give at least one capture file or --live IFACE")
    try:
        topic_re = re.compile(topic) if topic else None
    except re.error as e:
        raise click.BadParameter(f"{topic!r}: {e}", param_hint="--topic") from None
    portset = DEFAULT_PORTS | frozenset(ports)
    typeset = {t.upper() for t in types}
    st = Stats() if stats else None
    out = sys.stdout
    failed = False
    remaining = count
    tr = None
    if transport or sessions:
        tr = TransportRun(portset, as_json=as_json, topic_re=topic_re, types=typeset,
                          print_lbmr=transport or stats, print_records=transport and not stats, out=out)
    interrupted = False
    try:
        sources: list[Iterable] = []
        errors: list[CaptureError] = []
        for path in captures:
            sources.append(read_packets(path, on_error=errors.append) if tr is not None
                           else read_udp(path, ports=portset, on_error=errors.append))
        if iface:
            sources.append(_sniff_iter(iface, None, transport=tr is not None))
        try:
            for src in sources:
                if tr is not None:
                    n = tr.run(src, st, remaining)
                else:
                    n = run(src, portset, as_json=as_json, topic_re=topic_re, types=typeset, stats=st,
                            limit=remaining, out=out)
                for e in errors:
                    click.echo(f"lbmr-inspect: {e}", err=True)
                    failed = True
                errors.clear()
                if remaining is not None:
                    remaining -= n
                    if remaining <= 0:
                        break
        except KeyboardInterrupt:  # how --live ends; the summaries of what was seen still follow
            interrupted = True
        if st is not None:
            out.write((_json_line(st.as_dict()) if as_json else _printable(st.render())) + "\n")
        if sessions and tr is not None:
            state = tr.decoder.state
            out.write((_json_line(sessions_dict(state)) if as_json else _printable(render_sessions(state))) + "\n")
        out.flush()
    except BrokenPipeError:  # e.g. `| head`
        sys.stderr.close()
        sys.exit(0)
    except PermissionError as e:
        raise click.ClickException(f"{e} (live capture needs root)") from None
    except OSError as e:
        raise click.ClickException(str(e)) from None
    if failed:
        sys.exit(2)
    if interrupted and not iface:
        sys.exit(130)


if __name__ == "__main__":
    main()
