"""Sans-IO topic resolution (TR) of one endpoint portal of the TRD router, as a package.

A :class:`PortalTR` plays UM topic resolution inside one Topic Resolution
Domain (TRD) on behalf of the router: it learns which topics receivers of its
TRD want (their TQRs / wildcard TQRs), finds sources of the topics the *peer's*
receivers want (it queries its TRD like a UM receiver), and advertises proxy
sources for sources behind the peer (TIRs with the router's relay address,
like a UM source, answering TQRs at once). It owns no socket, no clock and no
task: every method takes ``now`` (seconds on any monotonic clock), inputs are
method calls, outputs are datagrams and events, in the style of
:mod:`router.peerlink`. One portal's calls must be made serially.

Driving it (the I/O shell)::

    tr = PortalTR(PortalTRSettings("east", 1, src_id=ctx_id, mode="lbmrd",
                                   daemons=[(ip, 15380)]), now=t0)
    loop:
        on a datagram:     tr.on_datagram(data, (ip, port), now)
        from the peer:     tr.add_remote_interest(topic, now) / tr.cancel_remote_interest(...)
                           tr.add_proxy(ProxySource(...), now) / tr.remove_proxy(advert_id, now)
        after any call and at tr.next_deadline():
                           for data, dest in tr.tick(now): sock.sendto(data, dest)
                           for ev in tr.events(): ...   # LocalInterest, SourceSeen, ...

Outgoing datagrams, the one rule: everything the portal produces -- scheduled
advertisements, queries, keepalives, and the immediate answers to TQRs that
:meth:`~PortalTR.on_datagram` makes -- is appended, in order, to one outgoing
buffer. :meth:`~PortalTR.tick` runs what is due at ``now``, then returns the
whole buffer and empties it; :meth:`~PortalTR.data_to_send` returns and empties
it without running timers. Items are :class:`Outgoing` ``(data, dest)`` named
tuples. Events accumulate the same way and :meth:`~PortalTR.events` drains them.

Wire behaviour (UM's, with :class:`lbmr_proto.um.Timing` defaults):

* every TR datagram is a version-1 LBMR packet (NORMAL: TQRs then TIRs;
  WC_TQR: wildcard queries) of at most ``max_datagram`` (1400) bytes, with a
  packet-options trailer: SourceIdOption(``src_id``), SourceTypeOption(1 =
  TNWGD, i.e. a router), VersionOption (UM 6.14) and LocalDomainOption
  (``domain_id``; UM contexts learn their TRD's domain id from DRO traffic).
  Records due at the same time are batched into as few datagrams as fit;
* ``mode="lbmrd"``: TR traffic goes to one current daemon, which changes
  round robin every ``timing.change_interval`` (0.2 s) counted from creation
  (daemon k mod n during the k-th interval, like :class:`lbmr_proto.um.Targets`);
  a daemon that has been sent nothing for ``timing.keepalive_interval``
  (0.5 s) gets a 4-byte keepalive (``02 00 00 00`` / ``03 00 00 00``
  alternately, no trailer, as UM sends them). The portal is always "alive":
  the first keepalives go out at creation so every lbmrd knows the portal
  before it has anything to say (it must hear the receivers' TQRs).
  Datagrams from an address that is not a configured daemon are ignored
  (UM's ``resolver_unicast_ignore_unknown_source``; ``ignore_unknown_source``);
* ``mode="multicast"``: everything goes to the (group, port); no keepalives;
  datagrams are accepted from anyone;
* proxy advertisements follow UM's source timing (10 ms doubling to 500 ms
  for 5 s, then every 1 s for 60 s, then quiescent -- answering TQRs only);
  the proxy TIR carries OtidOption(origin OTID) and DomainIdOption(origin
  domain), ttl 60, and the origin's topic index;
* queries for remote interest follow UM's receiver timing (20 ms doubling to
  200 ms for 5 s, then every 1 s for 60 s) until a source is seen.

Rules this module chose (the issue leaves them open):

* **What is ignored (loop prevention, single hop).** A datagram carrying our
  own ``src_id`` (our multicast loopback, an lbmrd echo) is dropped whole.
  From a datagram whose SourceTypeOption says TNWGD (another router) nothing
  is used: its TIRs are proxies, its TQRs are another router's proxy
  receivers -- this router bridges one hop only. A TIR with a DomainIdOption
  naming *another* domain is a proxy made elsewhere and is ignored; a
  DomainIdOption with *our* domain id is accepted (a UM source that learnt its
  TRD's id from us may stamp it). A TIR whose OTID is the OTID of one of our
  own proxies is ignored too (an echo that lost its trailer). Each case is
  counted in :meth:`~PortalTR.stats`.
* **Interest lifetime.** Local interest (a topic, or a PCRE/regex pattern)
  starts with the first TQR / WC-TQR (event :class:`LocalInterest`) and is
  refreshed by every later one. With the DRO's use queries (``use_query``,
  ``pattern_use_query``; the router always sets them from its file): an
  interest silent for ``periodic_interval`` gets a use query (TOPIC_MGMT,
  "topic use" record, PCRE/regex flag for patterns), repeated every
  ``timeout`` while unanswered; after ``max`` unanswered ones it ends
  (:class:`LocalInterestGone`), even while a proxy is advertised for it: this
  is how receivers that left while resolved (and so went quiet) are noticed.
  A use response ("in use", flag 0x80), a TQR or a WC-TQR answers; a
  leave-topic record makes the interest due for a use query at once. Use
  queries are paced (``use_query_limit``: the DRO's ``<rate-limit>``, 500 a
  second and 500,000 bits a second by default in the router) and batched. Without use queries (embedding default): it ends once
  ``interest_timeout`` seconds have passed with neither a TQR for it nor a
  proxy advertised here for it (while we advertise a proxy the interest is
  held; the countdown starts again when the last such proxy is removed).
  :meth:`~PortalTR.local_interests` lists the live interests; with
  ``refresh_pacing`` each yields :class:`LocalInterestRefresh` (for INTEREST
  REFRESH frames) after ``min`` seconds, then at doubling gaps up to ``max``.
* **Remote interest** (:meth:`~PortalTR.add_remote_interest`) is a set, not a
  count: adding it again is a refresh; it lasts until cancelled, or, with
  ``remote_topic`` / ``remote_pattern``, until a check (every
  ``check_interval``, at most ``max_checked`` interests each, round robin)
  finds it not refreshed for ``timeout`` (:class:`RemoteInterestExpired`).
  While it lasts the portal queries (UM burst while no source is known; afterwards one query every ``requery_interval``), and
  reports every matching source with :class:`SourceSeen`. Sources of the
  TRD's TIRs are remembered whether or not they are wanted, so a new interest
  in a topic whose source is known is answered at once (SourceSeen right away,
  plus one verifying query); their records are dropped silently after
  ``source_timeout`` without a TIR (at most ``max_sources`` unwanted ones).
* **SourceSeen means "(re)send the advertisement"**: it is emitted when a
  wanted source is first seen (``first=True``; also again after it was gone
  or after the interest was cancelled), when interest in a known source is
  added again (``first=False``), and when a known source's transport or topic
  index changes (``first=False``); never for plain refreshes.
  :class:`SourceGone` is emitted when a reported source sent no TIR for
  ``source_timeout`` while we kept re-querying; if that leaves an exact topic
  without sources, the UM query burst starts again.
* **OTID synthesis.** A TIR without OtidOption gets a deterministic OTID
  (:func:`lbmr_proto.um.synthesize_otid`): built from its transport identity
  and topic index in the layout of UM's ``lbmotid.c`` (TCP, LBT-RU, LBT-RM;
  context id and transport index zero); other transports get their type code,
  a BLAKE2b digest of the transport body and the topic index at offset 11.
  :func:`otid_topic_index` reads the
  topic index back, which is how a proxy gets the origin's topic index when
  the peer link did not carry it.
* **TR request burst.** With ``initial_request`` the portal sends a TR
  request (extended type 0x04, flags queries and wildcard queries) every
  ``period`` for ``duration`` seconds from its creation, so that receivers
  that are quiet (resolved, or past their query phase) query again and the
  router learns the TRD's interest at start (the DRO's ``<initial-request>``).
* **Domain routes.** With ``domain_routes`` (the DRO's ``<domain-route>``
  timing) and ``request_address`` (the router's request listener in the TRD,
  which the records name as the UIM listener) the portal sends remote
  domain route records (extended type 0x06) for the domains the router
  reaches (:meth:`~PortalTR.set_reachable_domains`) and answers TR requests
  that ask for them (:mod:`.domain_routes`).
* **Final advertisements.** :meth:`~PortalTR.remove_proxy` stops the normal
  advertisements and the TQR answers at once, then sends ``final_adverts``
  (default 3; 0 = none) final TIRs at the initial advertisement gaps (0, 10,
  30 ms): the same TIR with CostOption(its hop count, cost -1), the "infinite cost =
  withdrawn" marker (the public TRsniffer reading; UM's own encoding of a
  final advertisement is not public). Receivers that do not read it just see
  one more TIR of a source that is about to disappear.

The package: :mod:`.portal` (:class:`PortalTR`, the state machine),
:mod:`.settings` (:class:`PortalTRSettings`, :class:`UseQuery`,
:class:`RemoteCheck`), :mod:`.events` (what it takes and hands out),
:mod:`.timers` (its typed timers and their heap), :mod:`.pacing` (rate
limits), :mod:`.datagrams` (the datagrams it builds, its outgoing buffer),
:mod:`.adverts` (the proxies it advertises) and :mod:`.local_interest` (its
TRD's interest) and :mod:`.domain_routes` (its remote domain route
records). Which interest covers which topic is answered by
:class:`router.core.interest.InterestIndex`, one for the remote interest and
one for the local.
Every public name of those is importable from here. UM's timing,
destinations, OTIDs and datagram packing are in :mod:`lbmr_proto.um`.

Pattern types are the LBMR/LBRP values: 0 exact topic, 1 PCRE, 2 POSIX regex
(:class:`router.peerlink.PatternType`). Patterns are matched with
:class:`router.core.wildcard.Matcher` (``search``, Python's pattern syntax run
without backtracking), close enough to PCRE and POSIX ERE for topic names.
A pattern that cannot be matched is still queried (``bad_patterns``) but
covers no topic. The remote interest's distinct patterns hold at most
``max_remote_pattern_states`` NFA states summed
(:data:`router.core.interest.MAX_HELD_STATES` by default: one new topic costs
at most that many matcher steps per character against them); a pattern
beyond it is refused (``remote_pattern_states_refused``).
"""

from .adverts import relay_transport
from .events import (
    PATTERN_PCRE,
    PATTERN_REGEX,
    PATTERN_TOPIC,
    Addr,
    LocalInterest,
    LocalInterestGone,
    LocalInterestRefresh,
    Outgoing,
    ProxySource,
    RemoteInterestExpired,
    SourceGone,
    SourceSeen,
)
from .pacing import INTEREST_FRAME_OVERHEAD, QUERY_STEP, interest_frame_size
from .portal import PortalTR
from .settings import DomainRoutes, PortalTRSettings, RemoteCheck, UseQuery

__all__ = [
    "PortalTR", "PortalTRSettings", "UseQuery", "RemoteCheck", "DomainRoutes", "Addr", "Outgoing", "ProxySource",
    "LocalInterest", "LocalInterestGone", "LocalInterestRefresh", "SourceSeen", "SourceGone",
    "RemoteInterestExpired", "PATTERN_TOPIC", "PATTERN_PCRE", "PATTERN_REGEX", "relay_transport",
    "interest_frame_size", "INTEREST_FRAME_OVERHEAD", "QUERY_STEP",
]
