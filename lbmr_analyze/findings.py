"""Findings: the report's first section, built from the result tables.

Each finding is a dict: ``severity`` (``critical``, ``high``, ``medium``, ``low``),
``kind``, ``finding`` (one sentence naming topics, contexts and times),
``topics``, ``contexts`` (context names, `` | `` between them), ``first_seen``,
``last_seen``, ``table`` (the table with the details), ``session`` (a transport
finding's session, UM's source string; else "") and ``evidence`` (a transport
finding's figures, ``name=value``; else "").  Transport findings:
:mod:`lbmr_analyze.transport_findings`.  They are sorted most
severe first, then by kind, then by size.  At most :data:`PER_KIND` findings of
one kind are listed; one more finding says how many others the table holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from . import transport_findings
from .analyses import context_label, iso_us, share_text

SEVERITIES = ("critical", "high", "medium", "low")
#: Findings listed per kind before "and N more".
PER_KIND = 10
#: Queries after a topic's last advertisement that all came in the capture's last
#: this many seconds are noted "at capture end" and ranked low: too close to the
#: end to tell a silent source from one that would have answered, or from a
#: publisher that exited; seconds.
CAPTURE_END_S = 5
#: A storm's top senders named in its finding.
STORM_TOP = 3


def _f(severity, kind, text, table, *, topics="", contexts="", first=None, last=None, size=0) -> dict:
    return dict(severity=severity, kind=kind, finding=text, topics=topics, contexts=contexts,
                first_seen=first, last_seen=last, table=table, session="", evidence="", _size=size)


def _few(items: list[str], n: int = 3) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _name(addr: str, src_id: str | None) -> str:
    """The context name (:func:`lbmr_analyze.analyses.context_label`) of an
    ``ip:port`` column and a src_id column."""
    ip, _, port = addr.rpartition(":")
    return context_label(ip, int(port) if port.isdigit() else None, src_id)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us(iso: str | None) -> int | None:
    """An ISO time of the tables (``...Z``) -> epoch microseconds."""
    if not iso:
        return None
    return (datetime.fromisoformat(iso) - _EPOCH) // timedelta(microseconds=1)


class _Span:
    """The capture's first and last datagram (epoch microseconds, None when empty)."""

    def __init__(self, summary: dict) -> None:
        self.start = _us(summary.get("first_seen"))
        self.end = _us(summary.get("last_seen"))

    def since_start(self, iso: str) -> str:
        """``iso``, or the capture's start when it is later (a storm second may begin
        before the capture's first datagram)."""
        us = _us(iso)
        return iso if us is None or self.start is None or us >= self.start else iso_us(self.start)


def _storm_senders(top: list[tuple[str, int]], total: int, secs: int) -> str:
    """Who sent a storm: "sent mostly by X: 43/s, 87.0 % of 50/s" when one context
    sent more than half of it, else the top few with their shares."""
    if not top:
        return "no sender known"
    rate = f"{total / secs:,.0f}/s"
    if 2 * top[0][1] > total:
        name, n = top[0]
        return f"sent mostly by {name}: {n / secs:,.0f}/s, {share_text(n, total)} of {rate}"
    named = top[:STORM_TOP]
    rest = f"; {len(top) - len(named)} other context(s) sent the rest" if len(top) > len(named) else ""
    return ("no context sent most: top senders "
            + ", ".join(f"{c} {n / secs:,.0f}/s ({share_text(n, total)})" for c, n in named)
            + f", {share_text(sum(n for _c, n in named), total)} of {rate} together{rest}")


def build(tables: dict[str, list[dict]], summary: dict) -> list[dict]:
    """Every finding, most severe first."""
    span = _Span(summary)
    return _ranked(_conflicts(tables) + _never_advertised(tables) + _stale(tables, span)
                   + _storms(tables, summary, span) + _nat(tables) + _multi_transport(tables)
                   + _clients(tables) + _errors(tables) + transport_findings.build(tables))


def _conflicts(T: dict) -> list[dict]:
    out = [_f("critical", "transport conflict",
              f"Transport {x['transport_id']} is advertised by {x['n_contexts']} different contexts "
              f"({x['contexts']}) for topic(s) {_few(x['topics'].split())}: receivers may join the "
              f"wrong source.", "transport_conflicts", topics=x["topics"], contexts=x["contexts"],
              first=x["first_seen"], last=x["last_seen"], size=x["advertisements"])
           for x in T["transport_conflicts"]]
    return out + [_f("critical", "OTID collision",
                     f"OTID {x['otid'][:16]}... is used for {x['n_topics']} topic(s) ({_few(x['topics'].split())}) "
                     f"by {x['n_contexts']} context(s) ({x['contexts']}).", "otid_collisions",
                     topics=x["topics"], contexts=x["contexts"], size=x["advertisements"])
                  for x in T["otid_collisions"]]


def _never_advertised(T: dict) -> list[dict]:
    """One finding per topic queried and never advertised."""
    by_topic: dict[str, list[dict]] = {}
    for x in T["unresolved_topics"]:
        by_topic.setdefault(x["topic"], []).append(x)
    out = []
    for topic, rows in by_topic.items():
        names = [_name(r["querier"], r["src_id"]) for r in rows]
        qs = [f"{q} ({r['queries']} queries from {r['first_query']})" for q, r in zip(names, rows, strict=True)]
        out.append(_f("high", "never advertised",
                      f"Topic '{topic}' was queried {sum(r['queries'] for r in rows)} time(s) and never "
                      f"advertised in the capture; queriers: {_few(qs)}.", "unresolved_topics",
                      topics=topic, contexts=" | ".join(names),
                      first=min(r["first_query"] for r in rows), last=max(r["last_query"] for r in rows),
                      size=sum(r["queries"] for r in rows)))
    return out


def _stale(T: dict, span: _Span) -> list[dict]:
    """Queriers asking after their topic's last advertisement: high, or low "at
    capture end" (see :data:`CAPTURE_END_S`)."""
    out = []
    for x in T["stale_queries"]:
        who = _name(x["querier"], x["src_id"])
        after = _us(x["first_query_after"])
        at_end = span.end is not None and after is not None and span.end - after <= CAPTURE_END_S * 1_000_000
        why = (f"at capture end: these queries came in the capture's last {CAPTURE_END_S} s (the publisher may "
               f"have exited, or answered after the capture stopped)" if at_end else
               "the source went silent or this receiver does not hear it")
        out.append(_f("low" if at_end else "high", "querying after last advertisement",
                      f"{who} still queried topic '{x['topic']}' {x['queries_after']} time(s) after its last "
                      f"advertisement at {x['last_advertised']} (last query "
                      f"{x['last_query']}): {why}.", "stale_queries", topics=x["topic"],
                      contexts=who, first=x["first_query_after"], last=x["last_query"],
                      size=x["queries_after"]))
    return out


def _storms(T: dict, summary: dict, span: _Span) -> list[dict]:
    """One finding per storm episode (consecutive storm seconds)."""
    eps: list[list[dict]] = []
    for x in T["storms"]:
        if eps and x["second"] == eps[-1][-1]["second"] + 1:
            eps[-1].append(x)
        else:
            eps.append([x])
    per_sec: dict[int, list[dict]] = {}
    for c in T["storm_contexts"]:
        per_sec.setdefault(c["second"], []).append(c)
    out = []
    for ep in eps:
        tot: dict[str, int] = {}
        for x in ep:
            for c in per_sec.get(x["second"], []):
                k = _name(c["context"], c["src_id"])
                tot[k] = tot.get(k, 0) + c["packets"]
        top = sorted(tot.items(), key=lambda kv: (-kv[1], kv[0]))
        secs = len(ep)
        peak = max(x["packets"] for x in ep)
        total = sum(x["packets"] for x in ep)
        out.append(_f("high", "storm",
                      f"Storm of {secs} s from {span.since_start(ep[0]['time'])} (peak {peak:,} datagrams/s, threshold "
                      f"{summary.get('storm_threshold')}); {_storm_senders(top, total, secs)}.", "storms",
                      contexts=" | ".join(c for c, _n in top[:STORM_TOP]), first=ep[0]["time"],
                      last=ep[-1]["time"], size=total))
    return out


def _nat(T: dict) -> list[dict]:
    return [_f("high", "unreachable address",
               f"{x['advertiser']}{' (relayed by lbmrd)' if x['via_lbmrd'] else ''} advertises topic "
               f"'{x['topic']}' on {x['advertised_ip']} ({x['transport_id']}), an address no host of the "
               f"capture's networks shares: a NAT or interface setting is likely wrong.", "nat_audit",
               topics=x["topic"], contexts=x["advertiser"], first=x["first_seen"], last=x["last_seen"],
               size=x["advertisements"])
            for x in T["nat_audit"]]


def _multi_transport(T: dict) -> list[dict]:
    out = []
    for x in T["multi_transport_topics"]:
        who = f"[{x['src_id']}] {x['context']}" if x["src_id"] else x["context"]
        out.append(_f("medium", "one context, several transports",
                      f"Context {who} advertises topic '{x['topic']}' on {x['n_transports']} "
                      f"transports ({x['transports']}).", "multi_transport_topics", topics=x["topic"],
                      contexts=who, first=x["first_seen"], last=x["last_seen"],
                      size=x["advertisements"]))
    return out


def _clients(T: dict) -> list[dict]:
    out = []
    for x in T["client_changes"]:
        who = _name(x["client"], x["src_id"])
        if x["event"] == "vanished":
            out.append(_f("medium", "lbmrd client vanished",
                          f"lbmrd client {who} went silent at {x['time']} ({x['silent_s']} s before "
                          f"the end of the capture).", "client_changes", contexts=who, first=x["time"],
                          last=x["time"], size=x["datagrams"]))
        else:
            out.append(_f("low", "lbmrd client joined", f"lbmrd client {who} was first heard at "
                          f"{x['time']}.", "client_changes", contexts=who, first=x["time"], last=x["time"],
                          size=x["datagrams"]))
    return out


def _errors(T: dict) -> list[dict]:
    """Capture errors, undecodable datagrams, invalid wildcard patterns."""
    out = []
    if T["capture_errors"]:
        files = sorted({e["file"] for e in T["capture_errors"]})
        out.append(_f("medium", "capture errors",
                      f"{len(T['capture_errors'])} capture error(s) in {_few(files)}; the rest of each file "
                      f"was analysed.", "capture_errors", size=len(T["capture_errors"])))
    if T["decode_errors"]:
        srcs = sorted({f"{e['src']}:{e['sport']}" for e in T["decode_errors"]})
        out.append(_f("low", "undecodable datagrams",
                      f"{len(T['decode_errors'])} datagram(s) on LBMR ports are not valid LBMR, from {_few(srcs)}.",
                      "decode_errors", contexts=" | ".join(srcs), size=len(T["decode_errors"])))
    return out + [_f("low", "invalid wildcard pattern",
                     f"Wildcard pattern {p['pattern']!r} (type {p['pattern_type']}) from {p['queriers']} "
                     f"does not compile: {p['error']}.", "wildcard_patterns", contexts=p["queriers"],
                     first=p["first_seen"], last=p["last_seen"], size=p["queries"])
                  for p in T["wildcard_patterns"] if p["error"]]


def _ranked(out: list[dict]) -> list[dict]:
    """Most severe first, then by kind (in the order above), biggest first; at most
    :data:`PER_KIND` per kind, then one "... and N more"."""
    kinds: list[str] = []
    for f in out:
        if f["kind"] not in kinds:
            kinds.append(f["kind"])
    out.sort(key=lambda f: (SEVERITIES.index(f["severity"]), kinds.index(f["kind"]), -f["_size"],
                            f["first_seen"] or "", f["finding"]))
    res, count = [], {}
    for f in out:
        k = f["kind"]
        count[k] = count.get(k, 0) + 1
        if count[k] <= PER_KIND:
            res.append(f)
        elif count[k] == PER_KIND + 1:
            more = sum(1 for g in out if g["kind"] == k) - PER_KIND
            res.append(_f(f["severity"], k, f"... and {more} more '{k}' finding(s): see the table.",
                          f["table"]))
    for f in res:
        del f["_size"]
    return res
