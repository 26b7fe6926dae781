"""Access control lists of a portal (the DRO's ``<acl>``), sans-IO.

A portal may carry an ACL with an ``inbound`` and an ``outbound`` list of
access control entries (:class:`Ace`). *Inbound* tests what comes into the
router through the portal (a source heard in its TRD, an ADVERTISEMENT from
its peer): what it rejects is forwarded to no other portal. *Outbound* tests
what leaves through the portal (a proxy advertised in its TRD, an
ADVERTISEMENT to its peer): it can let a topic out of one portal and not
another.

Evaluation (as the DRO documents it):

* the entries are tried in order and the first that matches decides
  (``accept`` or ``reject``);
* a list that is configured but matches nothing rejects (implicit "reject
  all" at the end); a direction without a list accepts everything;
* inside one entry the conditions are ANDed, with one refinement of ours:
  the *topic* conditions (``<topic>``, ``<pcre-pattern>``,
  ``<regex-pattern>``) of one entry are alternatives (ORed), since an entry
  listing several topics or patterns (the DRO's own XInclude example) could
  otherwise never match;
* transport-session conditions (``<transport>``, ``<source-ip>``,
  ``<multicast-group>``, ``<udp-source-port>``, ``<udp-destination-port>``,
  ``<tcp-source-port>``, ``<xport-id>``) test the source's transport and only
  in inbound lists (the configuration loader refuses them in outbound lists,
  where the DRO would ignore them silently); one that does not apply to the
  source's transport (a UDP port on a TCP source) is ignored, but an entry
  none of whose conditions applies does not match (it never accepts or
  rejects a TCP source for its multicast group).

How it is applied by the router (:mod:`router.core.bridge`), for a source in TRD
S and receivers behind portal R:

* a source is bridged only if S's inbound list accepts its topic and
  transport session, and advertised out of R only if R's outbound list
  accepts its topic (:meth:`PortalAcl.allows_source_in`,
  :meth:`PortalAcl.allows_source_out`);
* interest (a TQR, an INTEREST frame) for a topic goes on toward the sources
  only where the data could come back: R's outbound list must accept the
  topic, and the portal it is sent out of must be able to accept it inbound
  for *some* transport session (:meth:`PortalAcl.allows_interest_in`,
  :meth:`PortalAcl.allows_interest_out`); this spares topic resolution for
  topics that can never cross;
* wildcard *patterns* of receivers (PCRE and regex interest) are not tested
  against the lists -- whether two regular languages intersect is not
  something to decide per query -- so they travel as before, and each
  concrete topic they bring is tested when its source is bridged (as the
  DRO notes, wildcard receivers can still cause topic resolution traffic for
  topics their portals reject).

Bounded time: topics come from the wire (hostile), patterns from the
configuration. Patterns are compiled with :class:`router.core.wildcard.Matcher`
(no backtracking: a test costs at most the pattern's states times the
topic's length) and a list's patterns may hold at most
:data:`MAX_ACL_STATES` states in all (:class:`AclError` beyond, reported
with file and line by the loader). A topic longer than
:data:`MAX_TOPIC_CHARS` (UM's ``LBM_MSG_MAX_TOPIC_LEN`` is 256 bytes with the
NUL) is no UM topic: a configured list rejects it without running a
pattern. Each list's topic conditions are one
:class:`router.core.interest.InterestIndex` (keyed by entry): the results
of up to :data:`CACHE_TOPICS` topics are remembered per list (the least
recently used forgotten first), so the repeated TIRs and TQRs of a topic
cost a dictionary look-up.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from enum import Enum

from lbmr_proto.constants import Transport

from .interest import CACHE_TOPICS, InterestIndex, Pattern
from .wildcard import PatternError

__all__ = [
    "MAX_TOPIC_CHARS",
    "MAX_ACL_STATES",
    "CACHE_TOPICS",
    "AclError",
    "Action",
    "Direction",
    "Comparison",
    "SessionField",
    "Session",
    "TopicIs",
    "TopicPattern",
    "TransportIs",
    "FieldCompare",
    "Ace",
    "Acl",
    "Decision",
    "PortalAcl",
    "OPEN",
    "TRANSPORT_WORDS",
    "COMPARISON_WORDS",
]

#: Longest topic (characters) a configured list tests; longer ones are rejected.
MAX_TOPIC_CHARS = 255
#: States (after expansion) of all the patterns of one list, at most.
MAX_ACL_STATES = 1000
# CACHE_TOPICS (from router.core.interest): topics whose results each list remembers


class AclError(ValueError):
    """An entry or condition that cannot be built (bad pattern, value, size)."""


class Action(Enum):
    ACCEPT = "accept"
    REJECT = "reject"


class Direction(Enum):
    INBOUND = "inbound"
    OUTBOUND = "outbound"


class Comparison(Enum):
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"

    def test(self, have: int, want: int) -> bool:
        if self is Comparison.EQ:
            return have == want
        if self is Comparison.NE:
            return have != want
        if self is Comparison.LT:
            return have < want
        if self is Comparison.LE:
            return have <= want
        if self is Comparison.GT:
            return have > want
        return have >= want


#: The DRO's comparison words (short and long forms).
COMPARISON_WORDS: dict[str, Comparison] = {
    "eq": Comparison.EQ, "equal": Comparison.EQ,
    "ne": Comparison.NE, "notequal": Comparison.NE,
    "lt": Comparison.LT, "lessthan": Comparison.LT,
    "le": Comparison.LE, "lessthanequal": Comparison.LE,
    "gt": Comparison.GT, "greaterthan": Comparison.GT,
    "ge": Comparison.GE, "greaterthanequal": Comparison.GE,
}

#: The DRO's transport words -> LBMR transport codes.
TRANSPORT_WORDS: dict[str, int] = {
    "tcp": Transport.TCP,
    "lbt-rm": Transport.LBTRM, "lbtrm": Transport.LBTRM,
    "lbt-ru": Transport.LBTRU, "lbtru": Transport.LBTRU,
    "lbt-ipc": Transport.LBTIPC, "lbtipc": Transport.LBTIPC,
}


class SessionField(Enum):
    """A transport-session property an entry can compare (value = element name)."""

    SOURCE_IP = "source-ip"
    MULTICAST_GROUP = "multicast-group"
    UDP_SOURCE_PORT = "udp-source-port"
    UDP_DESTINATION_PORT = "udp-destination-port"
    TCP_SOURCE_PORT = "tcp-source-port"
    XPORT_ID = "xport-id"

    @property
    def attr(self) -> str:
        return self.value.replace("-", "_")

    @property
    def is_address(self) -> bool:
        return self in (SessionField.SOURCE_IP, SessionField.MULTICAST_GROUP)


def _ip_int(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


@dataclass(frozen=True, slots=True)
class Session:
    """The transport session of a source, as far as it is known: its LBMR
    transport code and the properties that apply to it (None = does not
    apply or unknown). Addresses are IPv4 integers (host order)."""

    transport: int
    source_ip: int | None = None
    multicast_group: int | None = None
    udp_source_port: int | None = None
    udp_destination_port: int | None = None
    tcp_source_port: int | None = None
    xport_id: int | None = None

    @classmethod
    def of(cls, transport: int | str, *, source_ip: str | None = None,
           multicast_group: str | None = None, **ports: int) -> Session:
        """A session from readable values: ``transport`` a code or a DRO word
        (``"tcp"``, ``"lbt-ru"`` ...), addresses dotted quads."""
        code = TRANSPORT_WORDS[transport] if isinstance(transport, str) else int(transport)
        return cls(code, None if source_ip is None else _ip_int(source_ip),
                   None if multicast_group is None else _ip_int(multicast_group), **ports)

    @classmethod
    def from_transport(cls, body) -> Session:
        """The session of a TIR transport body (:mod:`lbmr_proto.records`):
        source IP for TCP, LBT-RM and LBT-RU; TCP source port; LBT-RU source
        port and LBT-RM source (NAK) port as the UDP source port; LBT-RM group
        and destination port; LBT-IPC transport id."""
        code = int(body.TYPE)

        def ip(name: str) -> int | None:
            v = getattr(body, name, None)
            try:
                return _ip_int(v) if v is not None else None
            except ValueError:
                return None

        if code == Transport.TCP:
            return cls(code, source_ip=ip("ip"), tcp_source_port=getattr(body, "port", None))
        if code == Transport.LBTRU:
            return cls(code, source_ip=ip("ip"), udp_source_port=getattr(body, "port", None))
        if code == Transport.LBTRM:
            return cls(code, source_ip=ip("ip"), multicast_group=ip("mcast_group"),
                       udp_source_port=getattr(body, "src_ucast_port", None),
                       udp_destination_port=getattr(body, "dest_port", None))
        if code == Transport.LBTIPC:
            return cls(code, xport_id=getattr(body, "xport_id", None))
        return cls(code)


# --------------------------------------------------------------------------- conditions


@dataclass(frozen=True, slots=True)
class TopicIs:
    """``<topic>``: the topic is exactly ``topic``."""

    topic: str

    def matches(self, topic: str) -> bool:
        return topic == self.topic


_POSIX_CLASSES = {
    "alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
    "space": r" \t\n\r\f\v", "blank": r" \t", "xdigit": "0-9A-Fa-f", "punct": r"!-/:-@\[-`{-~",
    "cntrl": r"\x00-\x1f\x7f", "print": r" -~", "graph": r"!-~",
}
_POSIX_CLASS_RE = re.compile(r"\[:([a-z]+):\]")


def _posix_to_pcre(pattern: str) -> str:
    """A POSIX extended regular expression (``<regex-pattern>``) in the syntax
    the matcher reads: bracket classes such as ``[[:alpha:]]`` become ranges."""
    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name not in _POSIX_CLASSES:
            raise AclError(f"unknown POSIX character class [:{name}:]")
        return _POSIX_CLASSES[name]
    return _POSIX_CLASS_RE.sub(repl, pattern)


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """``<pcre-pattern>`` / ``<regex-pattern>``: the pattern is found in the
    topic (``re.search`` semantics; anchor it with ``^``/``$`` as in UM).
    ``kind`` is ``"pcre"`` or ``"regex"`` (POSIX extended). Compiled when
    built: AclError if the matcher refuses it (syntax, unsupported
    construct, too large): ``compiled`` is the :class:`router.core.interest.
    Pattern` a list's :class:`~router.core.interest.InterestIndex` holds."""

    pattern: str
    kind: str = "pcre"
    compiled: Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("pcre", "regex"):
            raise AclError(f"unknown pattern kind {self.kind!r}")
        if not self.pattern:
            raise AclError("the pattern is empty")
        source = _posix_to_pcre(self.pattern) if self.kind == "regex" else self.pattern
        try:
            compiled = Pattern(source)
        except PatternError as e:
            raise AclError(str(e)) from None
        object.__setattr__(self, "compiled", compiled)

    @property
    def states(self) -> int:
        """The pattern's matcher states (a test costs at most this times the topic's length)."""
        return self.compiled.size

    def matches(self, topic: str) -> bool:
        return self.compiled.search(topic)


@dataclass(frozen=True, slots=True)
class TransportIs:
    """``<transport value=.. comparison=eq|ne>``."""

    transport: int
    equal: bool = True

    def applies(self, session: Session) -> bool:
        return True

    def holds(self, session: Session) -> bool:
        return (session.transport == self.transport) == self.equal


@dataclass(frozen=True, slots=True)
class FieldCompare:
    """``<source-ip>``, ``<multicast-group>``, ``<*-port>``, ``<xport-id>``:
    the session's ``field`` compared with ``value`` (addresses as integers,
    so ``lt``/``ge`` give address ranges)."""

    field: SessionField
    comparison: Comparison
    value: int

    def applies(self, session: Session) -> bool:
        return getattr(session, self.field.attr) is not None

    def holds(self, session: Session) -> bool:
        return self.comparison.test(getattr(session, self.field.attr), self.value)


TopicCondition = TopicIs | TopicPattern
SessionCondition = TransportIs | FieldCompare


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True, slots=True)
class Ace:
    """One access control entry: ``action`` when it matches. ``line`` is its
    line in the configuration file (0 if built in code)."""

    action: Action
    topics: tuple[TopicCondition, ...] = ()
    session: tuple[SessionCondition, ...] = ()
    line: int = 0

    def __post_init__(self) -> None:
        if not self.topics and not self.session:
            raise AclError("an entry needs at least one condition")

    def session_match(self, session: Session | None) -> bool | None:
        """Every session condition that applies holds (None: none applies)."""
        if session is None:
            return None
        applicable = [c for c in self.session if c.applies(session)]
        if not applicable:
            return None
        return all(c.holds(session) for c in applicable)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a list decided: ``accepted``, and the index of the entry that
    decided (None: no entry matched, or the topic was too long)."""

    accepted: bool
    entry: int | None


class Acl:
    """One direction's list of entries (first match decides, unmatched is
    rejected). Outbound lists ignore session conditions (and sessions)."""

    def __init__(self, entries: tuple[Ace, ...] | list[Ace],
                 direction: Direction = Direction.INBOUND) -> None:
        self.entries = tuple(entries)
        self.direction = Direction(direction)
        if not self.entries:
            raise AclError(f"an <{self.direction.value}> list needs at least one <ace>")
        states = sum(c.states for a in self.entries for c in a.topics if isinstance(c, TopicPattern))
        if states > MAX_ACL_STATES:
            raise AclError(f"the patterns of <{self.direction.value}> hold {states} matcher states "
                           f"in all (at most {MAX_ACL_STATES}): simplify or merge them")
        # the topic conditions, keyed (entry's index, condition's index)
        self._index: InterestIndex[tuple[int, int]] = InterestIndex(max_topics=CACHE_TOPICS)
        for i, ace in enumerate(self.entries):
            for j, c in enumerate(ace.topics):
                self._index.add((i, j), c.topic if isinstance(c, TopicIs) else c.compiled)
        self._topicless = frozenset(i for i, ace in enumerate(self.entries) if not ace.topics)

    def __repr__(self) -> str:
        return f"Acl({self.direction.value}, {len(self.entries)} entries)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Acl) and (self.entries, self.direction) == (other.entries, other.direction)

    def __hash__(self) -> int:
        return hash((self.direction, self.entries))

    @property
    def topics_cached(self) -> int:
        """How many topics' results the list remembers (at most
        :data:`~router.core.interest.CACHE_TOPICS`)."""
        return len(self._index.cache)

    def _candidates(self, topic: str) -> list[tuple[int, Ace, bool | None]]:
        """The entries that may match ``topic``, in order, as (index, entry,
        topic match): those a topic condition of which matches (True), and
        those without topic conditions (None)."""
        hit = {i for i, _ in self._index.matches(topic)}
        entries = self.entries
        return [(i, entries[i], True if i in hit else None) for i in sorted(hit.union(self._topicless))]

    def decide(self, topic: str, session: Session | None = None) -> Decision:
        """The decision for a source of ``topic`` with transport ``session``
        (None: not known; session conditions are then ignored, as for an
        outbound list)."""
        if len(topic) > MAX_TOPIC_CHARS:
            return Decision(False, None)
        if self.direction is Direction.OUTBOUND:
            session = None
        for i, ace, t in self._candidates(topic):
            s = ace.session_match(session)
            if s is False or (t is None and s is None):
                continue
            return Decision(ace.action is Action.ACCEPT, i)
        return Decision(False, None)

    def allows(self, topic: str, session: Session | None = None) -> bool:
        """Is a source of ``topic`` (with ``session``) accepted?"""
        return self.decide(topic, session).accepted

    def may_allow(self, topic: str) -> bool:
        """Could *some* transport session of ``topic`` be accepted? (For
        interest, sent before any source is known.) An entry whose topic
        conditions match and that has session conditions may or may not
        match: an accepting one answers yes, a rejecting one is passed over."""
        if len(topic) > MAX_TOPIC_CHARS:
            return False
        for _, ace, t in self._candidates(topic):
            if ace.session and self.direction is Direction.INBOUND:
                if ace.action is Action.ACCEPT:
                    return True
                continue
            if t is None:
                continue  # session conditions only, ignored outbound
            return ace.action is Action.ACCEPT
        return False


# --------------------------------------------------------------------------- a portal's ACL


@dataclass(frozen=True)
class PortalAcl:
    """A portal's ACL: ``inbound`` and ``outbound`` lists (None: that
    direction accepts everything). ``portal`` names the portal (for counters
    and logs), ``line`` is the ``<acl>`` element's line."""

    portal: str = ""
    inbound: Acl | None = None
    outbound: Acl | None = None
    line: int = 0

    @property
    def configured(self) -> bool:
        return self.inbound is not None or self.outbound is not None

    def named(self, portal: str) -> PortalAcl:
        """The same lists under the name ``portal``."""
        return self if portal == self.portal else PortalAcl(portal, self.inbound, self.outbound, self.line)

    def summary(self) -> dict:
        """For /status: the number of entries of each list (0 = no list)."""
        return {"inbound": len(self.inbound.entries) if self.inbound is not None else 0,
                "outbound": len(self.outbound.entries) if self.outbound is not None else 0}

    def allows_source_in(self, topic: str, session: Session | None = None) -> bool:
        """A source heard through this portal (a TIR in its TRD, an
        ADVERTISEMENT from its peer): may it be forwarded?"""
        return self.inbound is None or self.inbound.allows(topic, session)

    def allows_source_out(self, topic: str) -> bool:
        """May a source of ``topic`` be advertised out of this portal?"""
        return self.outbound is None or self.outbound.allows(topic)

    def allows_interest_in(self, topic: str, pattern_type: int = 0) -> bool:
        """Interest arriving through this portal (its receivers' TQRs, its
        peer's INTEREST): the data would leave through it, so its outbound
        list must accept the topic. Patterns (``pattern_type`` != 0) pass."""
        return pattern_type != 0 or self.outbound is None or self.outbound.allows(topic)

    def allows_interest_out(self, topic: str, pattern_type: int = 0) -> bool:
        """Interest sent out through this portal toward sources: the data
        would come in through it, so its inbound list must be able to accept
        the topic for some transport session. Patterns pass."""
        return pattern_type != 0 or self.inbound is None or self.inbound.may_allow(topic)


#: The ACL of a portal without ``<acl>``: everything passes.
OPEN = PortalAcl()
