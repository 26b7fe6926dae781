"""The ``<acl>`` element of a portal in lbmr-router's configuration, parsed
into a :class:`router.core.acl.PortalAcl` (the DRO's grammar)::

    <acl>
      <inbound>
        <ace match="accept|reject">  conditions, one or more  </ace> ...
      </inbound>
      <outbound> <ace ...> ... </ace> ... </outbound>
    </acl>

Conditions: ``<topic>`` (exact), ``<pcre-pattern>``, ``<regex-pattern>``
(POSIX extended, deprecated in the DRO), each with ``xml:space="preserve"``
to keep surrounding blanks; and, in ``<inbound>`` only, ``<transport
value="tcp|lbt-rm|lbtrm|lbt-ru|lbtru|lbt-ipc|lbtipc" comparison="eq|ne"/>``
and ``<source-ip>``, ``<multicast-group>``, ``<udp-source-port>``,
``<udp-destination-port>``, ``<tcp-source-port>``, ``<xport-id>`` with
``value`` and ``comparison`` (eq, ne, lt, le, gt, ge or the long forms).

:func:`parse_acl` reports every problem through the caller's ``error(line,
message)`` (the loader turns them into ``file:line: message``) and warnings
through ``warn(line, message)``; it reads only the element it is given.
"""

from __future__ import annotations

from collections.abc import Callable

from lxml import etree

from lbmr_runtime.values import DIGITS_RE, octets

from ..core.acl import (
    COMPARISON_WORDS,
    MAX_TOPIC_CHARS,
    TRANSPORT_WORDS,
    Ace,
    Acl,
    AclError,
    Action,
    Comparison,
    Direction,
    FieldCompare,
    PortalAcl,
    SessionField,
    TopicIs,
    TopicPattern,
    TransportIs,
)

__all__ = ["parse_acl", "ACL_TOPIC_ELEMENTS", "ACL_SESSION_ELEMENTS"]

Report = Callable[[int, str], None]

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
ACL_TOPIC_ELEMENTS = ("topic", "pcre-pattern", "regex-pattern")
ACL_SESSION_ELEMENTS = ("transport",) + tuple(f.value for f in SessionField)
_PORT_FIELDS = (SessionField.UDP_SOURCE_PORT, SessionField.UDP_DESTINATION_PORT,
                SessionField.TCP_SOURCE_PORT, SessionField.XPORT_ID)
_MAX_NUMBER_DIGITS = 10


def _line(el: etree._Element) -> int:
    return el.sourceline or 0


def _text(el: etree._Element) -> str:
    """The element's text, blanks around it trimmed unless xml:space="preserve"."""
    text = "".join(el.itertext()) if len(el) else (el.text or "")
    return text if el.get(XML_SPACE) == "preserve" else text.strip()


def _comparison(el: etree._Element, allowed: tuple[Comparison, ...] | None = None) -> Comparison:
    word = (el.get("comparison") or "").strip()
    if not word:
        raise AclError(f'<{el.tag}> needs comparison="eq" (or ne, lt, le, gt, ge)')
    cmp = COMPARISON_WORDS.get(word.lower())
    if cmp is None or (allowed is not None and cmp not in allowed):
        words = "eq, equal, ne, notequal" if allowed else ", ".join(COMPARISON_WORDS)
        raise AclError(f'<{el.tag}> comparison "{word}" is not one of {words}')
    return cmp


def _value(el: etree._Element) -> str:
    value = el.get("value")
    if value is None or not value.strip():
        raise AclError(f'<{el.tag}> needs a value="..." attribute')
    return value.strip()


def _session_condition(el: etree._Element) -> TransportIs | FieldCompare:
    if el.tag == "transport":
        word = _value(el)
        code = TRANSPORT_WORDS.get(word.lower())
        if code is None:
            raise AclError(f'<transport> value "{word}" is not a transport: give one of '
                           + ", ".join(TRANSPORT_WORDS))
        cmp = _comparison(el, (Comparison.EQ, Comparison.NE))
        return TransportIs(code, cmp is Comparison.EQ)
    fld = SessionField(el.tag)
    cmp = _comparison(el)
    text = _value(el)
    if fld.is_address:
        try:
            parts = octets(text, "address")
        except ValueError as e:
            raise AclError(f"<{el.tag}> value {e}") from None
        if len(parts) != 4:
            raise AclError(f'<{el.tag}> value "{text}" is not a full IPv4 address (a.b.c.d)')
        value = int.from_bytes(bytes(parts), "big")
        if fld is SessionField.MULTICAST_GROUP and cmp is Comparison.EQ and not 0xE0000000 <= value <= 0xEFFFFFFF:
            raise AclError(f'<multicast-group> value "{text}" is not a multicast address '
                           "(224.0.0.0 to 239.255.255.255)")
        return FieldCompare(fld, cmp, value)
    hi = 65535
    if not DIGITS_RE.fullmatch(text) or len(text) > _MAX_NUMBER_DIGITS or int(text) > hi:
        what = "a transport id" if fld is SessionField.XPORT_ID else "a port"
        raise AclError(f'<{el.tag}> value "{text}" is not {what} 0..{hi}')
    return FieldCompare(fld, cmp, int(text))


def _ace(el: etree._Element, direction: Direction, error: Report, warn: Report) -> Ace | None:
    match = (el.get("match") or "").strip()
    ok = True
    if match not in ("accept", "reject"):
        error(_line(el), '<ace> needs match="accept" or match="reject"'
                         + (f', not "{match}"' if match else ""))
        ok = False
    topics: list[TopicIs | TopicPattern] = []
    session: list[TransportIs | FieldCompare] = []
    for c in el:
        if not isinstance(c.tag, str):
            continue
        try:
            if c.tag == "topic":
                text = _text(c)
                if not text:
                    raise AclError("<topic> is empty: give a topic name")
                if len(text) > MAX_TOPIC_CHARS:
                    raise AclError(f"<topic> is {len(text)} characters long: UM topics have at "
                                   f"most {MAX_TOPIC_CHARS}")
                topics.append(TopicIs(text))
            elif c.tag in ("pcre-pattern", "regex-pattern"):
                kind = "pcre" if c.tag == "pcre-pattern" else "regex"
                text = _text(c)
                if not text:
                    raise AclError(f"<{c.tag}> is empty: give a pattern (.* matches every topic)")
                try:
                    topics.append(TopicPattern(text, kind))
                except AclError as e:
                    raise AclError(f"<{c.tag}> {text[:80]!r} is refused: {e}") from None
                if kind == "regex":
                    warn(_line(c), "<regex-pattern> is deprecated in the DRO: use <pcre-pattern>")
            elif c.tag in ACL_SESSION_ELEMENTS:
                if direction is Direction.OUTBOUND:
                    raise AclError(f"<{c.tag}> tests a source's transport session and only "
                                   "works in <inbound>: an <outbound> list tests topics "
                                   "(<topic>, <pcre-pattern>, <regex-pattern>)")
                session.append(_session_condition(c))
            else:
                raise AclError(f"<{c.tag}> is not an ACL condition: use "
                               + ", ".join(f"<{t}>" for t in ACL_TOPIC_ELEMENTS + ACL_SESSION_ELEMENTS))
        except AclError as e:
            error(_line(c), str(e))
            ok = False
    if not topics and not session:
        if ok:
            error(_line(el), "<ace> has no condition: give <topic>, <pcre-pattern> or (inbound) "
                             "a transport-session condition")
        return None
    if not ok:
        return None
    return Ace(Action(match), tuple(topics), tuple(session), _line(el))


def parse_acl(el: etree._Element, portal: str, error: Report, warn: Report | None = None) -> PortalAcl:
    """The :class:`PortalAcl` of portal ``portal`` from its ``<acl>`` element
    ``el``; problems go to ``error(line, message)`` (the result is then not
    to be used) and warnings to ``warn``."""
    warn = warn or (lambda line, msg: None)
    lists: dict[Direction, Acl | None] = {Direction.INBOUND: None, Direction.OUTBOUND: None}
    for child in el:
        if not isinstance(child.tag, str):
            continue
        try:
            direction = Direction(child.tag)
        except ValueError:
            error(_line(child), f"<{child.tag}> is not allowed in <acl>: it holds <inbound> "
                                "and <outbound>")
            continue
        if lists[direction] is not None:
            error(_line(child), f"<acl> has more than one <{child.tag}>")
            continue
        entries = []
        bad = False
        for a in child:
            if not isinstance(a.tag, str):
                continue
            if a.tag != "ace":
                error(_line(a), f"<{a.tag}> is not allowed in <{child.tag}>: it holds <ace> entries")
                bad = True
                continue
            ace = _ace(a, direction, error, warn)
            if ace is None:
                bad = True
            else:
                entries.append(ace)
        if bad:
            continue
        if not entries:
            error(_line(child), f"<{child.tag}> has no <ace>: give at least one (an empty list "
                                "would reject everything)")
            continue
        try:
            lists[direction] = Acl(entries, direction)
        except AclError as e:
            error(_line(child), str(e))
    result = PortalAcl(portal, lists[Direction.INBOUND], lists[Direction.OUTBOUND], _line(el))
    if not result.configured and not any(isinstance(c.tag, str) for c in el):
        warn(_line(el), "<acl> is empty (no <inbound>, no <outbound>): it changes nothing")
    return result
