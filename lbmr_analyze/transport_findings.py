"""Findings about transport sessions, from the transport tables
(:mod:`lbmr_analyze.transport`): rules that hold for any capture, each finding
naming its session, topics, contexts and times, with the figures it rests on
(``evidence``), ranked with the other findings (:mod:`lbmr_analyze.findings`).

The UM defaults the rules compare against are UM's documented ones (receiver
and source configuration options named in each finding; lbmr-analyze(1) lists
what each finding means for a UM configuration).  A capture does not show the
configured values: the findings say "with the defaults" where that matters.
"""

from __future__ import annotations

from lbmr_proto.constants import LBMRD_PORT

from .analyses import iso_us, share_text

#: transport_lbtrm_nak_generation_interval (receiver): how long a receiver NAKs
#: one sequence number before it declares it unrecoverable; seconds (default).
NAK_GENERATION_S = 10.0
#: transport_lbtrm_ignore_interval (source): NAKs for a datagram within this of
#: its last retransmission are answered "NAK ignored"; seconds (default).
IGNORE_INTERVAL_S = 0.5
#: transport_lbtrm_nak_backoff_interval (receiver): the wait between NAKs of one
#: datagram, randomised 0.5x-1.5x; seconds (default).
NAK_BACKOFF_S = 0.2
#: transport_lbtrm_nak_suppress_interval (receiver): the wait after an NCF; seconds (default).
NAK_SUPPRESS_S = 1.0
#: A receiver NAKing more than this share of the session's original datagrams is lossy.
LOSS_THRESHOLD = 0.01
#: A receiver sending more NAK packets per second than this (over its active span, at least 1 s) NAKs too much.
NAK_RATE_THRESHOLD = 50.0
#: Retransmitted bytes over original bytes above this: retransmissions cost the session too much.
RETRANSMISSION_RATIO = 0.05
#: NAK packets to one session in one second at or above this: a NAK storm second.
NAK_STORM_PER_S = 200
#: Zero-window segments from one TCP receiver at or above this: the window stayed at zero.
ZERO_WINDOW_SEGMENTS = 2
#: Outstanding sequence numbers listed in a finding.
LIST_SQNS = 10

_LBTRM_OPT = {"LBTRM": "transport_lbtrm", "LBTRU": "transport_lbtru"}


def _f(severity, kind, text, table, *, topics="", contexts="", first=None, last=None, size=0, session="",
       evidence="") -> dict:
    return dict(severity=severity, kind=kind, finding=text, topics=topics, contexts=contexts,
                first_seen=first, last_seen=last, table=table, session=session, evidence=evidence, _size=size)


def _opt(transport: str, name: str) -> str:
    return f"{_LBTRM_OPT.get(transport, 'transport_lbtrm')}_{name}"


def _ev(**kw) -> str:
    return ", ".join(f"{k}={v}" for k, v in kw.items())


def _secs(a: str | None, b: str | None) -> float | None:
    from .findings import _us
    ua, ub = _us(a), _us(b)
    return None if ua is None or ub is None else (ub - ua) / 1e6


def _plus(iso: str, seconds: float) -> str:
    from .findings import _us
    return iso_us(_us(iso) + round(seconds * 1e6))


def _ctx(s: dict) -> str:
    """The session's source context(s) and receivers, `` | `` between them."""
    names = [f"source {c}" for c in s["source_contexts"].split()] + s["receivers"].split()
    return " | ".join(n.removeprefix("ctx:") for n in names)


def build(T: dict[str, list[dict]]) -> list[dict]:
    """Every transport finding (unranked)."""
    sessions = {s["session"]: s for s in T.get("transport_sessions", [])}
    if not sessions:
        return []
    recv = T.get("transport_receivers", [])
    return (_source_stopped(sessions, recv) + _ncfs(sessions) + _lossy_receivers(sessions, recv)
            + _nak_storms(sessions, T.get("transport_timeline", [])) + _retransmissions(sessions)
            + _idle_windows(sessions, T.get("transport_timeline", []))
            + _uninteresting(sessions, T.get("transport_topics", []), T)
            + _unadvertised(sessions, recv) + _receivers_gone(sessions, recv) + _tcp_receivers(sessions, recv)
            + _bad_input(T))


def _source_stopped(sessions: dict, recv: list[dict]) -> list[dict]:
    """A receiver with sequence numbers NAKed and never retransmitted after:
    critical when the source had stopped (its last packet before the
    receiver's last NAK, or ICMP port unreachable answering NAKs), else
    high ("NAKs never answered" by the capture's end).  A session whose NAKs
    met ICMP errors with nothing left outstanding: medium.  Only ICMP errors
    quoting datagrams sent to the source (``icmp_errors``) count; those quoting
    the source's own datagrams say a receiver is gone (:func:`_receivers_gone`)."""
    out = []
    with_outstanding = set()
    for r in recv:
        s = sessions[r["session"]]
        if not r["outstanding_count"]:
            continue
        with_outstanding.add(s["session"])
        src_last = s["source_last"] or s["last_original_ts"]
        naked_after = src_last is not None and r["last_ts"] is not None and r["last_ts"] > src_last
        sqns = r["outstanding"].split()[:LIST_SQNS]
        listed = " ".join(sqns) + (" ..." if r["outstanding_count"] > len(sqns) else "")
        topics = s["topics"]
        if naked_after or s["icmp_errors"]:
            until = _plus(r["outstanding_to"], NAK_GENERATION_S)
            linger = _secs(s["last_original_ts"], until) if s["last_original_ts"] else None
            icmp = (f"; the source's host answered {s['icmp_errors']} NAK(s) with ICMP port unreachable from "
                    f"{s['icmp_first']} (the source had exited)" if s["icmp_errors"] else "")
            linger_text = (f" The source should have lingered at least {linger:.1f} s after its last message "
                           f"(until {until}: the latest first NAK of these plus the receivers' "
                           f"{_opt(s['transport'], 'nak_generation_interval')}, {NAK_GENERATION_S:g} s by "
                           f"default) before it was deleted." if linger is not None else "")
            out.append(_f(
                "critical", "unrecoverable loss: source stopped",
                f"Receiver {r['receiver']} of {s['source']} (topics {topics or 'unknown'}) was still NAKing "
                f"{r['outstanding_count']} sequence number(s) ({listed}) when the source stopped: its last "
                f"packet at {src_last}, last original at {s['last_original_ts']}; the receiver NAKed until "
                f"{r['last_ts']}{icmp}. Likely unrecoverable loss.{linger_text}",
                "transport_receivers", topics=topics, contexts=_ctx(s), first=r["outstanding_from"],
                last=r["last_ts"], size=r["outstanding_count"], session=s["source"],
                evidence=_ev(outstanding=r["outstanding_count"], last_nak=r["last_ts"], source_last=src_last,
                             icmp_errors=s["icmp_errors"])))
        else:
            out.append(_f(
                "high", "NAKs never answered",
                f"Receiver {r['receiver']} of {s['source']} NAKed {r['outstanding_count']} sequence number(s) "
                f"({listed}) that were never retransmitted before the capture ended (first NAKs "
                f"{r['outstanding_from']} .. {r['outstanding_to']}); see the session's NCFs.",
                "transport_receivers", topics=topics, contexts=_ctx(s), first=r["outstanding_from"],
                last=r["last_ts"], size=r["outstanding_count"], session=s["source"],
                evidence=_ev(outstanding=r["outstanding_count"], last_nak=r["last_ts"], source_last=src_last)))
    for s in sessions.values():
        if s["icmp_errors"] and s["session"] not in with_outstanding:
            out.append(_f(
                "medium", "NAKs to a stopped source",
                f"{s['icmp_errors']} NAK(s) to {s['source']} were answered with ICMP port unreachable from "
                f"{s['icmp_first']} to {s['icmp_last']}: the source's process had exited while receivers were "
                f"still recovering (every NAKed sequence number in the capture was retransmitted).",
                "transport_sessions", topics=s["topics"], contexts=_ctx(s), first=s["icmp_first"],
                last=s["icmp_last"], size=s["icmp_errors"], session=s["source"],
                evidence=_ev(icmp_errors=s["icmp_errors"], source_last=s["source_last"])))
    return out


#: NCF reason column -> (kind, severity, what it means for the configuration)
NCF_MEANING = {
    "ncf_ignored": ("NCF: NAK ignored", "medium", lambda t: (
        f"the source got NAKs for datagrams it had retransmitted less than its {_opt(t, 'ignore_interval')} "
        f"({IGNORE_INTERVAL_S * 1000:.0f} ms by default) before. A receiver's {_opt(t, 'nak_backoff_interval')} "
        f"({NAK_BACKOFF_S * 1000:.0f} ms by default, randomised 0.5x-1.5x) is shorter than the source's ignore "
        f"interval, so a receiver that lost a retransmission NAKs again too soon, is ignored and waits its "
        f"{_opt(t, 'nak_suppress_interval')} ({NAK_SUPPRESS_S:g} s by default) more: make the receivers' NAK "
        f"backoff longer than the source's ignore interval (or the ignore interval shorter)")),
    "ncf_shed": ("NCF: NAK shed", "high", lambda t: (
        f"the source reached its retransmission rate limit ({_opt(t, 'retransmit_rate_limit')}) and shed "
        f"NAKs: loss exceeds what the source may repair; reduce the loss, or raise the limit if the network "
        f"has room")),
    "ncf_rx_delay": ("NCF: retransmit delay", "medium", lambda t: (
        "the source delayed the retransmission (it had retransmitted the datagram very recently, or holds "
        "retransmissions back for a while): receivers NAK sooner than the source answers, which costs them a "
        f"{_opt(t, 'nak_suppress_interval')} wait")),
    "ncf_no_retry": ("NCF: do not retry", "high", lambda t: (
        "the source will not retransmit these datagrams (no longer in its transmission window, "
        f"{_opt(t, 'transmission_window_size')}): the receivers' loss of them is unrecoverable; a longer window "
        "or less loss is needed")),
}


def _ncfs(sessions: dict) -> list[dict]:
    out = []
    for s in sessions.values():
        for col, (kind, sev, meaning) in NCF_MEANING.items():
            n = s[col]
            if not n:
                continue
            out.append(_f(sev, kind, f"{s['source']} answered NAKs with {n} NCF(s) '{kind[5:]}': "
                                     f"{meaning(s['transport'])}.",
                          "transport_sessions", topics=s["topics"], contexts=_ctx(s), first=s["first_ts"],
                          last=s["last_ts"], size=n, session=s["source"],
                          evidence=_ev(**{col: n, "nak_packets": s["nak_packets"]})))
    return out


def _lossy_receivers(sessions: dict, recv: list[dict]) -> list[dict]:
    out = []
    for r in recv:
        if not r["nak_packets"]:
            continue
        s = sessions[r["session"]]
        span = max(_secs(r["first_ts"], r["last_ts"]) or 0.0, 1.0)
        rate = r["nak_packets"] / span
        lossy, naky = r["loss_estimate"] > LOSS_THRESHOLD, rate > NAK_RATE_THRESHOLD
        if not (lossy or naky):
            continue
        why = []
        if lossy:
            why.append(f"NAKed {r['naked_sqns']} distinct datagrams, {share_text(r['naked_sqns'], s['originals'])} "
                       f"of the session's {s['originals']} originals (threshold {LOSS_THRESHOLD:.0%})")
        if naky:
            why.append(f"sent {rate:.1f} NAKs/s over {span:.1f} s (threshold {NAK_RATE_THRESHOLD:g}/s)")
        out.append(_f(
            "high", "lossy receiver",
            f"Receiver {r['receiver']} of {s['source']} {' and '.join(why)}; recovery p50 "
            f"{r['recovery_p50'] * 1000:.1f} ms, max {r['recovery_max'] * 1000:.1f} ms.",
            "transport_receivers", topics=s["topics"], contexts=_ctx(s), first=r["first_ts"], last=r["last_ts"],
            size=r["naked_sqns"], session=s["source"],
            evidence=_ev(loss_estimate=r["loss_estimate"], naked_sqns=r["naked_sqns"], originals=s["originals"],
                         nak_packets=r["nak_packets"], nak_rate=round(rate, 1))))
    return out


def _episodes(seconds: list[dict]) -> list[list[dict]]:
    eps: list[list[dict]] = []
    for x in seconds:
        if eps and x["second"] == eps[-1][-1]["second"] + 1:
            eps[-1].append(x)
        else:
            eps.append([x])
    return eps


def _by_session(timeline: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for x in timeline:
        out.setdefault(x["session"], []).append(x)
    return out


def _nak_storms(sessions: dict, timeline: list[dict]) -> list[dict]:
    out = []
    for key, rows in _by_session(timeline).items():
        s = sessions.get(key)
        if s is None:
            continue
        for ep in _episodes([x for x in rows if x["nak_packets"] >= NAK_STORM_PER_S]):
            naks = sum(x["nak_packets"] for x in ep)
            orig = sum(x["originals"] for x in ep)
            rx = sum(x["retransmissions"] for x in ep)
            peak = max(x["nak_packets"] for x in ep)
            out.append(_f(
                "high", "NAK storm",
                f"NAK storm on {s['source']}: {len(ep)} s from {ep[0]['time']} with {naks} NAK packets (peak "
                f"{peak}/s, threshold {NAK_STORM_PER_S}/s) against {orig} original datagrams and {rx} "
                f"retransmissions.", "transport_timeline", topics=s["topics"], contexts=_ctx(s),
                first=ep[0]["time"], last=ep[-1]["time"], size=naks, session=s["source"],
                evidence=_ev(seconds=len(ep), nak_packets=naks, peak=peak, originals=orig, retransmissions=rx)))
    return out


def _retransmissions(sessions: dict) -> list[dict]:
    out = []
    for s in sessions.values():
        if not s["original_bytes"] or not s["retransmissions"]:
            continue
        ratio = s["retransmission_bytes"] / s["original_bytes"]
        if ratio <= RETRANSMISSION_RATIO:
            continue
        out.append(_f(
            "medium", "retransmission rate",
            f"{s['source']} retransmitted {s['retransmissions']} datagrams ({s['retransmission_bytes']} bytes), "
            f"{ratio:.1%} of its original traffic ({s['originals']} datagrams, {s['original_bytes']} bytes; "
            f"threshold {RETRANSMISSION_RATIO:.0%}) for {s['nak_packets']} NAK packets.",
            "transport_sessions", topics=s["topics"], contexts=_ctx(s), first=s["first_ts"], last=s["last_ts"],
            size=s["retransmissions"], session=s["source"],
            evidence=_ev(retransmission_bytes=s["retransmission_bytes"], original_bytes=s["original_bytes"],
                         ratio=round(ratio, 4))))
    return out


def _idle_windows(sessions: dict, timeline: list[dict]) -> list[dict]:
    """Seconds after its first data in which a source sent session messages
    and no data: an idle window (low); NAKs in such a window (medium): tail loss, the loss of the
    last datagrams before the pause, which only the SMs' lead sequence number
    reveals, or recovery still under way."""
    out = []
    for key, rows in _by_session(timeline).items():
        s = sessions.get(key)
        if s is None:
            continue
        started = next((x["second"] for x in rows if x["originals"]), None)
        if started is None:      # (session messages before any data: a handshake, e.g. LBT-RU's SYN)
            continue
        idle = [x for x in rows if x["session_messages"] and not x["originals"] and x["second"] > started]
        for ep in _episodes(idle):
            sms = sum(x["session_messages"] for x in ep)
            naks = sum(x["nak_packets"] for x in ep)
            if naks:
                out.append(_f(
                    "medium", "NAKs in an idle window",
                    f"{s['source']} sent no new data for {len(ep)} s from {ep[0]['time']}, only {sms} session "
                    f"message(s), while receivers sent {naks} NAK(s): loss at the tail of the last burst, which "
                    f"no later datagram reveals, only the session messages' lead sequence number (sent after "
                    f"{_opt(s['transport'], 'sm_minimum_interval')}, 200 ms by default, doubling), or recovery "
                    f"still under way when the data stopped.", "transport_timeline",
                    topics=s["topics"], contexts=_ctx(s), first=ep[0]["time"], last=ep[-1]["time"], size=naks,
                    session=s["source"], evidence=_ev(seconds=len(ep), session_messages=sms, nak_packets=naks)))
            else:
                out.append(_f(
                    "low", "idle session",
                    f"{s['source']} sent only {sms} session message(s) and no data for {len(ep)} s from "
                    f"{ep[0]['time']}.", "transport_timeline", topics=s["topics"], contexts=_ctx(s),
                    first=ep[0]["time"], last=ep[-1]["time"], size=len(ep), session=s["source"],
                    evidence=_ev(seconds=len(ep), session_messages=sms)))
    return out


def _wildcard_topics(T: dict) -> dict[str, set[str]]:
    """context ``ip:port`` -> topics matched by the wildcard patterns it queried."""
    by_pattern: dict[tuple, set[str]] = {}
    for m in T.get("wildcard_matches", []):
        by_pattern.setdefault((m["pattern"], m["pattern_type"]), set()).add(m["topic"])
    out: dict[str, set[str]] = {}
    for p in T.get("wildcard_patterns", []):
        topics = by_pattern.get((p["pattern"], p["pattern_type"]), set())
        for label in (p["queriers"] or "").split(" | "):
            addr = label.split(" ")[-1] if label.startswith(("[", "via")) else label.split(" ")[0]
            out.setdefault(addr, set()).update(topics)
    return out


def _uninteresting(sessions: dict, topics: list[dict], T: dict) -> list[dict]:
    """A context that asked for some of a session's topics (so it receives the
    session) while the session carries others it never asked for, by TQR or
    wildcard pattern: UM drops those as uninteresting-topic messages.  Queries
    heard only as lbmrd relayed them (from its port) name no context: skipped."""
    per_session: dict[str, list[dict]] = {}
    for t in topics:
        per_session.setdefault(t["session"], []).append(t)
    wild = _wildcard_topics(T)
    out = []
    for key, rows in per_session.items():
        s = sessions.get(key)
        if s is None:
            continue
        carried = {t["topic"] or f"tidx {t['tidx']}": t["messages"] + t["rx_messages"]
                   for t in rows if t["messages"] + t["rx_messages"]}
        wanted: dict[str, set[str]] = {}
        for t in rows:
            for c in t["queriers"].split():
                wanted.setdefault(c, set()).add(t["topic"])
        for ctx in sorted(wanted):
            if ctx.endswith(f":{LBMRD_PORT}"):   # an lbmrd relaying some context's queries: not a context
                continue
            asked = wanted[ctx] | wild.get(ctx, set())
            extra = {tp: n for tp, n in carried.items() if tp not in asked}
            if not extra:
                continue
            n = sum(extra.values())
            total = sum(carried.values())
            host = ctx.rpartition(":")[0]
            naks = [r for r in s["receivers"].split() if not r.startswith("ctx:") and r.startswith(host + ":")]
            tie = (f"; its host also sends this session's NAKs ({', '.join(naks)})" if naks else "")
            out.append(_f(
                "medium", "uninteresting topic traffic",
                f"Context {ctx} receives {s['source']} for {', '.join(sorted(wanted[ctx]))} but the "
                f"session also carries {', '.join(f'{tp} ({m} messages)' for tp, m in sorted(extra.items()))}, "
                f"which it never asked for in the capture: {n} of {total} messages ({share_text(n, total)}) are "
                f"work its UM drops as uninteresting-topic messages{tie}. Map those topics to another transport "
                f"session (another source context or transport address) if this context does not need them.",
                "transport_topics", topics=" | ".join(sorted(extra)), contexts=ctx, first=s["first_ts"],
                last=s["last_ts"], size=n, session=s["source"],
                evidence=_ev(uninteresting_messages=n, messages=total, asked=" | ".join(sorted(wanted[ctx])))))
    return out


def _unadvertised(sessions: dict, recv: list[dict]) -> list[dict]:
    out = []
    for r in recv:
        s = sessions[r["session"]]
        if s["from_tir"]:
            continue
        where = f"group {s['group']}:{s['dport']}" if s["group"] else f"{s['source_ip']}:{s['port']}"
        out.append(_f(
            "medium", "receiver of an unadvertised session",
            f"Receiver {r['receiver']} is a receiver of {s['source']} ({where}; {r['packets']} packet(s) from "
            f"{r['first_ts']}), a session no TIR in the capture advertised: the capture began after its "
            f"advertisements, or the receiver joined an address no source advertises (a stale or static "
            f"configuration).", "transport_receivers", contexts=r["receiver"], first=r["first_ts"],
            last=r["last_ts"], size=r["packets"], session=s["source"],
            evidence=_ev(from_tir=False, receiver_packets=r["packets"])))
    return out


def _receivers_gone(sessions: dict, recv: list[dict]) -> list[dict]:
    """A receiver whose host answered the source's datagrams (DATA, SM, NCF,
    RST) with ICMP port unreachable: it had closed its socket while the source
    still sent to it (low; an LBT-RU source keeps a client until its
    activity timeout).  Never evidence that the source stopped."""
    out = []
    for r in recv:
        if not r["icmp_errors"]:
            continue
        s = sessions[r["session"]]
        out.append(_f(
            "low", "datagrams to a closed receiver",
            f"The host of receiver {r['receiver']} of {s['source']} answered {r['icmp_errors']} of the source's "
            f"datagrams to it with ICMP port unreachable: the receiver had closed its socket (it left, or its "
            f"process exited) while the source still sent to it"
            + (f" (an LBT-RU source sends to a client until its {_opt('LBTRU', 'client_activity_timeout')} "
               f"passes without word from it)" if s["transport"] == "LBTRU" else "")
            + ". The source did not stop.",
            "transport_receivers", topics=s["topics"], contexts=_ctx(s), first=r["first_ts"], last=r["last_ts"],
            size=r["icmp_errors"], session=s["source"],
            evidence=_ev(receiver_icmp_errors=r["icmp_errors"])))
    return out


def _tcp_receivers(sessions: dict, recv: list[dict]) -> list[dict]:
    out = []
    for r in recv:
        if r["kind"] != "tcp":
            continue
        s = sessions[r["session"]]
        if r["zero_windows"] >= ZERO_WINDOW_SEGMENTS:
            out.append(_f(
                "high", "slow TCP receiver",
                f"Receiver {r['receiver']} of {s['source']} advertised a zero TCP window in {r['zero_windows']} "
                f"segments between {r['first_ts']} and {r['last_ts']}: it does not keep up and paces the source "
                f"(an LBT-TCP source goes at its slowest receiver's pace unless configured otherwise), slowing "
                f"every receiver of the session.", "transport_receivers", topics=s["topics"], contexts=_ctx(s),
                first=r["first_ts"], last=r["last_ts"], size=r["zero_windows"], session=s["source"],
                evidence=_ev(zero_windows=r["zero_windows"])))
        if r["resets"]:
            out.append(_f(
                "low", "TCP session reset",
                f"The connection of receiver {r['receiver']} to {s['source']} was reset ({r['resets']} RST).",
                "transport_receivers", topics=s["topics"], contexts=_ctx(s), first=r["first_ts"],
                last=r["last_ts"], size=r["resets"], session=s["source"], evidence=_ev(resets=r["resets"])))
    return out


def _bad_input(T: dict) -> list[dict]:
    rows = T.get("transport_errors", [])
    bad = [r for r in rows if r["kind"] == "bad input"]
    kept = [r for r in rows if r["kind"] != "bad input"]
    out = []
    if bad:
        n = sum(r["count"] for r in bad)
        out.append(_f("low", "transport bad input",
                      f"{n} transport packet(s) did not decode and were counted and dropped: "
                      + ", ".join(f"{r['reason']} {r['count']}" for r in bad) + ".", "transport_errors", size=n,
                      evidence=_ev(**{r["reason"]: r["count"] for r in bad})))
    if kept:
        n = sum(r["count"] for r in kept)
        out.append(_f("low", "transport bounds reached",
                      "Bounds on the transport state kept out " + ", ".join(f"{r['count']} {r['reason']}"
                                                                           for r in kept)
                      + ": the transport tables are incomplete there.", "transport_errors", size=n,
                      evidence=_ev(**{r["reason"]: r["count"] for r in kept})))
    return out
