"""lbmr-router's configuration grammar: the built-in DTD and the words
that turn libxml2's validation messages into configuration terms (with
hints for DRO elements we do not support)."""

from __future__ import annotations

from importlib import resources

from lxml import etree

from lbmr_runtime.xmlconfig import Grammar

from .acl import ACL_SESSION_ELEMENTS, ACL_TOPIC_ELEMENTS

#: The DTD printed by ``lbmr-router -d`` (package data ``router/config/router.dtd``).
DTD_TEXT: str = resources.files(__package__ or "router").joinpath("router.dtd").read_text(encoding="utf-8")

_TIMING = ("<initial-request/>, <topic-use-query>, <pattern-use-query>, "
           "<remote-topic-interest>, <remote-pattern-interest>, <domain-route>")
_TIMING_ELEMENTS = ("initial-request", "topic-use-query", "pattern-use-query",
                    "remote-topic-interest", "remote-pattern-interest", "domain-route")
_CONTENT = {
    "lbmr-router": "<daemon> followed by <portals>",
    "daemon": ("<name>, then optionally <log>, <metrics>, <metrics-tls>, <stats-interval>, <route-info/>, "
               "in this order"),
    "portals": "one or more <endpoint> and <peer> elements",
    "endpoint": ("<name>, <domain-id>, optionally <cost>, <source-deletion-delay>, then "
                 "<topic-resolution>, then optionally <relay/>, <lbt-rm/>, <request-tcp/>, <acl>, "
                 "<remote-topic/>, <remote-pattern/>, in this order"),
    "topic-resolution": ("either <multicast/>, or an optional <interface>, one or more "
                         "<lbmrd/> and an optional <port-range/>; then optionally "
                         f"{_TIMING}, in this order"),
    "peer": ("<name>, <single-tcp>, then optionally <max-queue>, <acl>, <gateway-keepalive/>, in this "
             "order (and optionally <cost> right after <name>)"),
    "single-tcp": ("optionally <interface>, <receive-buffer>, <send-buffer>, <keepalive/>, "
                   "<nodelay/>, <tls>, in this order, then exactly one <initiator> or <acceptor>"),
    "acl": "optionally <inbound>, then optionally <outbound>",
    "inbound": "one or more <ace> entries",
    "outbound": "one or more <ace> entries",
    "ace": ("one or more conditions: <topic>, <pcre-pattern>, <regex-pattern>, and (inbound "
            "only) <transport/>, <source-ip/>, <multicast-group/>, <udp-source-port/>, "
            "<udp-destination-port/>, <tcp-source-port/>, <xport-id/>"),
    "initiator": "<address> followed by <port>",
    "acceptor": "<listen-port>",
    **{name: "at most one <rate-limit bps=\"..\" objects-per-second=\"..\"/>" for name in (
        "topic-use-query", "pattern-use-query", "remote-topic-interest",
        "remote-pattern-interest", "domain-route")},
    "tls": ("<certificate>, <certificate-key>, then optionally <certificate-key-password>, "
            "<trusted-certificates>, <cipher-suites>, in this order"),
    "metrics-tls": ("<certificate>, <certificate-key>, then optionally <certificate-key-password>, "
                    "<trusted-certificates>, <cipher-suites>, in this order"),
}
_REQUIRED = {
    "lbmr-router": ("daemon", "portals"),
    "daemon": ("name",),
    "endpoint": ("name", "domain-id", "topic-resolution"),
    "peer": ("name", "single-tcp"),
    "initiator": ("address", "port"),
    "acceptor": ("listen-port",),
    "tls": ("certificate", "certificate-key"),
    "metrics-tls": ("certificate", "certificate-key"),
}
_ATTR_HINT = {
    ("lbmrd", "address"): ' (the IPv4 address of the lbmrd, e.g. address="10.1.1.50")',
}
_DRO_STYLE = "as in the DRO"
_INITIATOR_CHILDREN = f"write <address> and <port> as child elements of <initiator>, {_DRO_STYLE}"
_ACCEPTOR_CHILD = f"write <listen-port> as a child element of <acceptor>, {_DRO_STYLE}"
_ATTR_AS_CHILD = {
    ("initiator", "address"): _INITIATOR_CHILDREN,
    ("initiator", "port"): _INITIATOR_CHILDREN,
    ("acceptor", "port"): _ACCEPTOR_CHILD,
    ("acceptor", "listen-port"): _ACCEPTOR_CHILD,
    ("endpoint", "name"): f"write <name> as a child element, {_DRO_STYLE}",
    ("endpoint", "domain-id"): f"write <domain-id> as a child element, {_DRO_STYLE}",
    ("peer", "name"): f"write <name> as a child element, {_DRO_STYLE}",
}

_UM_CONFIG = ("lbmr-router does not read UM configuration files: describe the TRD with "
              "<topic-resolution> (<multicast/> or <lbmrd/>) and <relay/>")
_UNSUPPORTED = "a DRO setting that lbmr-router does not support (yet): remove it"
_NO_FUNCTION = "a DRO element without function (deprecated or removed): remove it"
_DRO_HINTS = {
    "lbm-config": _UM_CONFIG,
    "lbm-attributes": _UM_CONFIG,
    "xml-config": _UM_CONFIG,
    "web-monitor": "lbmr-router serves metrics over HTTP instead: <metrics>127.0.0.1:9390</metrics>",
    "monitor": "use <metrics> and <stats-interval> in <daemon>",
    "daemon-monitor": "use <metrics> and <stats-interval> in <daemon>",
    "publishing-interval": "use <metrics> and <stats-interval> in <daemon>",
    "compression": "compression of the peer link is not supported (yet): remove it on both routers",
    "udp": "the UDP peer link is not supported: lbmr-router's peer link is TCP only",
    "tcp": "the DRO's dual-TCP <tcp> peer was removed in UM 6.10: use <single-tcp>",
    "companion": "the DRO's dual-TCP <tcp> peer was removed in UM 6.10: use <single-tcp>",
    **{name: _UNSUPPORTED for name in (
        "hotlink-index", "smart-batch", "batching", "sourcemap", "max-datagram",
        "sqn-window", "route-recalculation", "topicmap", "patternmap", "uid",
        "gid", "pidfile", "lbm-license-file", "context-query", "source-context-name",
        "receiver-context-name", "propagation-delay")},
    **{name: _NO_FUNCTION for name in (
        "topic-purge", "topic-interest-generate", "topic-domain-activity", "pattern-purge",
        "pattern-interest-generate", "pattern-domain-activity", "topic-use-check",
        "pattern-use-check", "late-join")},
}


def _elements(el: etree._Element) -> list[etree._Element]:
    return [c for c in el if isinstance(c.tag, str)]


def _found(el: etree._Element) -> str:
    items = []
    if (el.text or "").strip():
        items.append("text")
    for c in el:
        if isinstance(c.tag, str):
            items.append(f"<{c.tag}>")
        if (c.tail or "").strip():
            items.append("text")
    return ", ".join(items) or "nothing"


_REPEATABLE = {("portals", "endpoint"), ("portals", "peer"), ("topic-resolution", "lbmrd"),
               ("inbound", "ace"), ("outbound", "ace"),
               *(("ace", c) for c in ACL_TOPIC_ELEMENTS + ACL_SESSION_ELEMENTS)}


def _content_message(el: etree._Element) -> str:
    """Why ``el``'s children do not follow the DTD, in configuration terms."""
    name = el.tag
    kids = _elements(el)
    where: dict[str, list[int]] = {}
    for kid in kids:
        where.setdefault(kid.tag, []).append(kid.sourceline or 0)
    if name == "single-tcp":
        if "initiator" in where and "acceptor" in where:
            return (f"<single-tcp> has both <initiator> (line {where['initiator'][0]}) and "
                    f"<acceptor> (line {where['acceptor'][0]}): a peer portal either connects "
                    "to its peer (<initiator>) or listens for it (<acceptor>), keep one")
        if "initiator" not in where and "acceptor" not in where:
            return ("<single-tcp> has neither <initiator> nor <acceptor>: give "
                    "<initiator><address>..</address><port>..</port></initiator> to connect "
                    "to the peer, or <acceptor><listen-port>..</listen-port></acceptor> to "
                    "listen for it")
    if name == "topic-resolution":
        if "multicast" in where and "lbmrd" in where:
            return (f"<topic-resolution> has both <multicast> (line {where['multicast'][0]}) "
                    f"and <lbmrd> (line {where['lbmrd'][0]}): a TRD uses either multicast or "
                    "unicast (lbmrd) topic resolution")
        if "multicast" not in where and "lbmrd" not in where:
            return ("<topic-resolution> needs <multicast group=\"..\" port=\"..\"/> or at "
                    'least one <lbmrd address=".." port=".."/>')
        timing = [k.tag for k in kids if k.tag in _TIMING_ELEMENTS]
        if "initial-request" in timing[1:] and timing.count("initial-request") == 1:
            return (f"<initial-request> (line {where['initial-request'][0]}) must come before "
                    f"the other timing elements of <topic-resolution> (the DRO's file has it "
                    f"last): it must contain {_CONTENT['topic-resolution']}")
    want = _CONTENT.get(name, "other content")
    for need in _REQUIRED.get(name, ()):
        if need not in where:
            return f"<{name}> has no <{need}>: it must contain {want}; found {_found(el)}"
    for tag, lines in where.items():
        if len(lines) > 1 and (name, tag) not in _REPEATABLE:
            return (f"<{name}> has <{tag}> {len(lines)} times (lines "
                    f"{', '.join(map(str, lines))}): it must contain {want}")
    return f"<{name}> must contain {want}; found {_found(el)}"


class _RouterGrammar(Grammar):
    """lbmr-router's wording: DRO hints, "did you mean", content explained
    from the element itself."""

    def content_error(self, name: str, got: str, els: list[etree._Element]) -> str:
        if not els:
            return f"<{name}> must contain {self.content.get(name, 'other content')}"
        return _content_message(els[0])


GRAMMAR = _RouterGrammar("lbmr-router", DTD_TEXT, content=_CONTENT, attr_hints=_ATTR_HINT,
                         element_hints=_DRO_HINTS, attr_as_child=_ATTR_AS_CHILD, suggest=True)


def dtd_errors(tree: etree._ElementTree) -> list[tuple[int, str]]:
    out = GRAMMAR.errors(tree)
    # on one line, an unknown element or attribute explains the rest: report it first
    return sorted(out, key=lambda e: (e[0], not e[1].startswith("unknown ")))
