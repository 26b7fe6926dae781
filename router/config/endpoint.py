"""The value checkers of an ``<endpoint>`` portal of lbmr-router's
configuration: :func:`parse_endpoint` and one function per element inside it
(``<topic-resolution>`` with its ``<multicast>`` or ``<lbmrd>`` list and its
timing elements, ``<relay>``, ``<lbt-rm>``, ``<request-tcp>``, ``<remote-topic>``,
``<remote-pattern>``; the portal's ``<acl>`` through
:meth:`router.config.checker.Checker.portal_acl`).

Each checker reads one element that the DTD has already validated, reports
problems to the :class:`~router.config.checker.Checker` and returns the
:mod:`router.config.model` value (the default after an error). Times are in
milliseconds, sizes in bytes, rates in bits or objects a second (the DRO's
units).
"""

from __future__ import annotations

import ipaddress

from lxml import etree

from lbmr_runtime.xmlconfig import element_text

from ..core.fanout import DEFAULT_MAX_QUEUE as DEFAULT_FANOUT_MAX_QUEUE
from ..core.fanout import MIN_MAX_QUEUE as MIN_FANOUT_QUEUE
from .checker import INT_MAX, Checker, parse_ipv4, parse_unicast
from .model import (
    DEFAULT_LBMRD_PORT,
    DEFAULT_MAX_PROXIES,
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_MULTICAST_PORT,
    DEFAULT_MULTICAST_TTL,
    DEFAULT_RELAY_PORTS,
    DEFAULT_REQUEST_PORT,
    DEFAULT_SOURCE_DELETION_DELAY_MS,
    DEFAULT_TR_PORTS,
    DomainRoute,
    EndpointConfig,
    InitialRequest,
    InterestPacing,
    LbmrdAddress,
    LbtrmConfig,
    MulticastResolver,
    RateLimit,
    RelayConfig,
    RemoteInterest,
    RequestListener,
    TopicResolution,
    UseQuery,
)

_BPS_MAX = 10**12  # <rate-limit bps>: a terabit a second is more than any link
_DOMAIN_ID_MAX = 2**32 - 1  # u32 on the peer link, 0 invalid


def _rate_limit(c: Checker, parent: etree._Element, default: RateLimit, what: str) -> RateLimit:
    """The ``<rate-limit>`` child of a timing element (DRO units: bits a second,
    objects a second; an attribute left out keeps the DRO's default for
    ``parent``; 0 = no limit of that kind)."""
    el = parent.find("rate-limit")
    if el is None:
        return default
    limit = RateLimit(
        c.attr_int(el, "bps", default.bps,
                   f"bits a second 0..{_BPS_MAX} (0 = no limit by bits)", 0, _BPS_MAX),
        c.attr_int(el, "objects-per-second", default.objects_per_second,
                   f"{what} a second 0..{INT_MAX} (0 = no limit by count)", 0, INT_MAX))
    if limit == RateLimit(0, 0) and parent.tag != "domain-route":
        c.warn(el, f"<rate-limit> of <{parent.tag}> has bps 0 and objects-per-second 0: "
                   f"{what} are not paced at all (a burst of them goes out at once)")
    return limit


def _use_query(c: Checker, el: etree._Element | None) -> UseQuery:
    d = UseQuery()
    if el is None:
        return d
    return UseQuery(c.attr_ms(el, "timeout", d.timeout_ms),
                    c.attr_int(el, "max", d.max, f"a count 1..{INT_MAX}", 1, INT_MAX),
                    c.attr_ms(el, "periodic-interval", d.periodic_interval_ms),
                    _rate_limit(c, el, d.rate_limit, "use queries"))


def _interval_pair(c: Checker, el: etree._Element, lo_default: int,
                   hi_default: int) -> tuple[int, int] | None:
    lo = c.attr_ms(el, "min-interval", lo_default)
    hi = c.attr_ms(el, "max-interval", hi_default)
    if hi < lo:
        c.error(el, f"<{el.tag}> min-interval {lo} is greater than max-interval {hi}")
        return None
    return lo, hi


def _pacing(c: Checker, el: etree._Element | None) -> InterestPacing:
    d = InterestPacing()
    if el is None:
        return d
    pair = _interval_pair(c, el, d.min_interval_ms, d.max_interval_ms)
    limit = _rate_limit(c, el, d.rate_limit, "interest refreshes")
    return d if pair is None else InterestPacing(*pair, limit)


def _domain_route(c: Checker, el: etree._Element | None) -> DomainRoute | None:
    """``<domain-route>``: the timing of the remote domain route records (sent
    with a ``<request-tcp>`` listener only; :func:`_request_listener` warns otherwise)."""
    if el is None:
        return None
    d = DomainRoute()
    pair = _interval_pair(c, el, d.min_interval_ms, d.max_interval_ms)
    limit = _rate_limit(c, el, d.rate_limit, "domain route messages")
    lo, hi = pair if pair is not None else (d.min_interval_ms, d.max_interval_ms)
    return DomainRoute(lo, hi, limit, line=el.sourceline or 0)


def _request_listener(c: Checker, el: etree._Element | None, tr: TopicResolution,
                      relay: RelayConfig) -> RequestListener | None:
    """``<request-tcp interface port/>``: the router's request listener in the TRD,
    advertised in the domain route records (UIMs) and in the proxies' late-join
    options (LJI and OTR requests). Its address must be one UM applications can
    connect to."""
    if el is None:
        if tr.domain_route is not None:
            c.warn(tr.domain_route.line, "<domain-route> has no effect without a <request-tcp> listener "
                                         "in this <endpoint>: domain route records advertise its address")
        return None
    port = c.attr_port(el, "port", DEFAULT_REQUEST_PORT, "TCP")
    iface = c.attr_interface(el, "interface")
    where = iface if iface is not None else tr.interface
    if el.get("interface") is None and where in (None, "0.0.0.0"):
        c.error(el, "<request-tcp> has no interface and neither has <topic-resolution>: the domain route "
                    "records and the proxies' late-join options advertise the listener's address to UM "
                    "applications, which must be able to connect to it: give interface=\"...\" (an "
                    "address, a CIDR network or a device name)")
    elif iface == "0.0.0.0":
        c.error(el, '<request-tcp> interface "*" (any address) cannot be advertised: give the address '
                    "(or network, or device) UM applications connect to")
    if relay.ports is not None and port in relay.ports:
        riface = relay.interface
        if riface in (None, "0.0.0.0") or where in (None, "0.0.0.0") or riface == where:
            c.error(el, f"<request-tcp> port {port} is inside the <relay> port range {relay.ports} on the "
                        "same interface: the proxies may take it; give a port outside the range")
    return RequestListener(iface, port, el.sourceline or 0)


def _remote(c: Checker, el: etree._Element | None, max_attr: str) -> RemoteInterest:
    d = RemoteInterest()
    if el is None:
        return d
    return RemoteInterest(c.attr_ms(el, "check-interval", d.check_interval_ms),
                          c.attr_int(el, max_attr, d.max, f"a count 1..{INT_MAX}", 1, INT_MAX),
                          c.attr_ms(el, "timeout", d.timeout_ms))


def _topic_resolution(c: Checker, tr: etree._Element) -> TopicResolution:
    multicast = None
    lbmrds: list[LbmrdAddress] = []
    interface = None
    port_range = None
    mc = tr.find("multicast")
    if mc is not None:
        group = DEFAULT_MULTICAST_GROUP
        if mc.get("group") is not None:
            try:
                group = parse_ipv4(mc.get("group", ""), "a multicast group such as 224.9.10.11")
                if not ipaddress.IPv4Address(group).is_multicast:
                    raise ValueError(f'"{group}" is not a multicast address '
                                     "(224.0.0.0 to 239.255.255.255)")
            except ValueError as e:
                c.error(mc, f"<multicast> group {e}")
        port = c.attr_port(mc, "port", DEFAULT_MULTICAST_PORT, "UDP")
        interface = c.attr_interface(mc, "interface")
        ttl = c.attr_int(mc, "ttl", DEFAULT_MULTICAST_TTL, "a TTL 0..255 (hops)", 0, 255)
        multicast = MulticastResolver(group, port, line=mc.sourceline or 0, ttl=ttl)
    else:
        interface = c.interface(tr.find("interface"))
        seen: dict[tuple[str, int], int] = {}
        for el in tr.iterchildren("lbmrd"):
            try:
                addr = parse_unicast(el.get("address", ""), "the IPv4 address of the lbmrd")
            except ValueError as e:
                c.error(el, f"<lbmrd> address {e}")
                continue
            port = c.attr_port(el, "port", DEFAULT_LBMRD_PORT, "UDP")
            line = el.sourceline or 0
            if (addr, port) in seen:
                c.warn(el, f"lbmrd {addr}:{port} is listed twice (also at line {seen[addr, port]})")
                continue
            seen[addr, port] = line
            lbmrds.append(LbmrdAddress(addr, port, line))
        pr = tr.find("port-range")
        port_range = DEFAULT_TR_PORTS if pr is None else c.port_range(
            pr, "low", "high", DEFAULT_TR_PORTS, "UDP")
    ir = tr.find("initial-request")
    initial = InitialRequest()
    if ir is not None:
        initial = InitialRequest(
            c.attr_ms(ir, "periodic-interval", initial.periodic_interval_ms),
            c.attr_int(ir, "duration", initial.duration_s,
                       f"seconds 0..{INT_MAX} (0 = no burst)", 0, INT_MAX))
    return TopicResolution(
        multicast=multicast, lbmrds=tuple(lbmrds), interface=interface, port_range=port_range,
        initial_request=initial,
        topic_use_query=_use_query(c, tr.find("topic-use-query")),
        pattern_use_query=_use_query(c, tr.find("pattern-use-query")),
        remote_topic_interest=_pacing(c, tr.find("remote-topic-interest")),
        remote_pattern_interest=_pacing(c, tr.find("remote-pattern-interest")),
        line=tr.sourceline or 0,
        domain_route=_domain_route(c, tr.find("domain-route")),
    )


def _fanout(c: Checker, el: etree._Element | None) -> tuple[bool, int]:
    """``<relay fanout max-queue>``: (fan-out on, queue bytes per receiver)."""
    queue = c.attr_int(el, "max-queue", DEFAULT_FANOUT_MAX_QUEUE,
                       f"bytes {MIN_FANOUT_QUEUE}..{INT_MAX} (at least one 65535-byte message)",
                       MIN_FANOUT_QUEUE, INT_MAX)
    if el is None:
        return True, queue
    word = el.get("fanout", "on").strip().lower()
    if word not in ("on", "off"):
        c.error(el, f'<relay> fanout "{el.get("fanout")}": write "on" (one copy per session per '
                    'link, the default) or "off" (one stream per receiver connection)')
    return word != "off", queue


def parse_endpoint(c: Checker, ep: etree._Element) -> EndpointConfig:
    name = c.name(ep.find("name"), "a name for this endpoint portal")
    dom_el = ep.find("domain-id")
    domain_id = 0
    if element_text(dom_el) == "0":
        c.error(dom_el, "<domain-id> 0 is not a valid domain id: give the id of this TRD, "
                        f"1..{_DOMAIN_ID_MAX} (UM treats 0 as invalid in route messages)")
    else:
        domain_id = c.text_int(dom_el, 0, f"the id of this TRD, 1..{_DOMAIN_ID_MAX}",
                               1, _DOMAIN_ID_MAX)
    cost = c.text_int(ep.find("cost"), 1, f"a positive cost 1..{INT_MAX}", 1, INT_MAX)
    delay = c.text_int(ep.find("source-deletion-delay"), DEFAULT_SOURCE_DELETION_DELAY_MS,
                       f"milliseconds 0..{INT_MAX}", 0, INT_MAX)
    tr = _topic_resolution(c, ep.find("topic-resolution"))
    relay_el = ep.find("relay")
    relay = RelayConfig(tr.interface, DEFAULT_RELAY_PORTS)
    max_proxies = c.attr_int(relay_el, "max-proxies", DEFAULT_MAX_PROXIES,
                             "a number of proxies 1..1000000", 1, 1_000_000)
    if relay_el is not None:
        iface = c.attr_interface(relay_el, "interface")
        ports = c.port_range(relay_el, "port-low", "port-high", DEFAULT_RELAY_PORTS, "TCP")
        relay = RelayConfig(iface if iface is not None else tr.interface, ports,
                            relay_el.sourceline or 0)
        if len(ports) < 2:
            c.warn(relay_el, f"<relay> has a single port ({ports.low}): the portal can relay "
                             "only one transport session into its TRD at a time; give a "
                             "range of at least 2 ports")
    fanout, fanout_queue = _fanout(c, relay_el)
    rm_el = ep.find("lbt-rm")
    lbtrm = LbtrmConfig() if rm_el is None else _lbtrm(c, rm_el)
    listener = _request_listener(c, ep.find("request-tcp"), tr, relay)
    return EndpointConfig(
        name=name, domain_id=domain_id, topic_resolution=tr, relay=relay, lbtrm=lbtrm,
        fanout=fanout, fanout_max_queue=fanout_queue,
        source_deletion_delay_ms=delay, cost=cost, max_proxies=max_proxies,
        remote_topic=_remote(c, ep.find("remote-topic"), "max-topics"),
        remote_pattern=_remote(c, ep.find("remote-pattern"), "max-patterns"),
        line=ep.sourceline or 0, acl=c.portal_acl(ep, name),
        request_listener=listener,
    )


def _lbtrm(c: Checker, el: etree._Element) -> LbtrmConfig:
    """``<lbt-rm group-low group-high destination-port same-group/>``."""
    d = LbtrmConfig()
    groups = []
    for attr, default in (("group-low", d.group_low), ("group-high", d.group_high)):
        text = el.get(attr)
        if text is None:
            groups.append(default)
            continue
        try:
            ip = parse_ipv4(text, "a multicast group")
            if not ipaddress.IPv4Address(ip).is_multicast:
                raise ValueError(f'"{text}" is not a multicast address (224.0.0.0/4)')
            groups.append(ip)
        except ValueError as e:
            c.error(el, f"<lbt-rm> {attr} {e}")
            groups.append(default)
    low, high = (int(ipaddress.IPv4Address(g)) for g in groups)
    if high < low:
        c.error(el, f"<lbt-rm> group-low {groups[0]} is above group-high {groups[1]}: the range is reversed")
        groups = [d.group_low, d.group_high]
    elif high - low >= 1 << 16:
        c.error(el, f"<lbt-rm> {groups[0]}..{groups[1]} is {high - low + 1} groups: at most 65536")
        groups = [d.group_low, d.group_high]
    port = c.attr_port(el, "destination-port", d.destination_port, "UDP")
    same = el.get("same-group", "no").strip()
    if same not in ("yes", "no"):
        c.error(el, f'<lbt-rm> same-group "{same}": write "yes" or "no"')
    transport = el.get("transport", "lbt-rm").strip().lower()
    transport = {"lbtrm": "lbt-rm", "lbtru": "lbt-ru"}.get(transport, transport)
    if transport not in ("lbt-rm", "lbt-ru"):
        c.error(el, f'<lbt-rm> transport "{el.get("transport")}": write "lbt-rm" (multicast) or "lbt-ru" '
                    "(unicast to each receiver)")
        transport = "lbt-rm"
    if transport == "lbt-ru":
        given = [a for a in ("group-low", "group-high", "destination-port", "same-group") if el.get(a) is not None]
        if given:
            c.warn(el, f'<lbt-rm transport="lbt-ru"> ignores {", ".join(given)}: its proxies are unicast')
    max_clients = c.attr_int(el, "max-clients", d.max_clients, "a number of receivers 1..4096", 1, 4096)
    return LbtrmConfig(groups[0], groups[1], port, same == "yes", el.sourceline or 0, transport, max_clients)
