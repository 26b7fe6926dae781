"""router: lbmr-router, a Topic Resolution Domain (TRD) router in the role of UM's DRO.

The map, bottom up (each folder imports only from the ones above it in this
list; its own docstring says more):

* :mod:`router.peerlink` - the peer-link protocol, sans-IO, h11-style
  (frames, codec, connection, writer queue, streams; spec in
  ``router/PEERLINK.md``).
* :mod:`router.core` - the router's logic, sans-IO:
  :class:`router.core.router_core.RouterCore`, the control plane with one
  calling contract (TR datagrams, link up / frames / down, proxies
  listening, sessions ended, ticks in; typed outputs drained), built of the
  topic resolution of each endpoint portal (:mod:`router.core.tr`) and its
  sharing among links, the bridge of each endpoint on each link, proxy
  sessions, routing and transit, ACLs, the one interest index
  (:mod:`router.core.interest`); and the data plane's state machines: the
  fan-out queues, the message path every relayed LBMC message passes
  (:mod:`router.core.message_path`), the answer addresses of
  messages (:mod:`router.core.message_addresses`), requests and responses
  (:mod:`router.core.request_maps`), UIMs routed by domain (:mod:`router.core.uim`),
  late-join and OTR requests (:mod:`router.core.recovery`), the LBT-RM and
  LBT-RU proxies and the LBT-RU proxy receiver.
* :mod:`router.config` - reads and checks the XML file (``load_config``,
  ``parse_config``) into immutable settings (:mod:`router.config.model`).
* :mod:`router.link` - one connected peer link on trio (:class:`router.link.Link`):
  the stream state and the order of its bytes (:mod:`router.link.stream`),
  the bounded writer (:mod:`router.link.writer`), the zero-copy reader
  (:mod:`router.link.reader`) and the splice pipes (:mod:`router.link.splice`).
* :mod:`router.relays` - the data plane on trio: the relay of an endpoint on
  a link (:mod:`router.relays.endpoint_relay`: relay ports, proxies, and the
  table that picks the relay of each transport), and the relays, all of one
  written interface (:mod:`router.relays.interface`: lifecycle and typed
  settings, the accepting and refusing of a peer's stream): TCP fan-out (the
  receivers' side :mod:`router.relays.tcp_fanout`, the origin's side
  :mod:`router.relays.tcp_fanout_origin`) and per connection
  (:mod:`router.relays.tcp_streams`), LBT-RU likewise
  (:mod:`router.relays.lbtru_fanout`, :mod:`router.relays.lbtru_streams`),
  LBT-RM (:mod:`router.relays.lbtrm`); the request listener
  (:mod:`router.relays.uim`) and UIM destinations
  (:mod:`router.relays.uim_targets`), responses
  (:mod:`router.relays.responses`), late-join and OTR answers
  (:mod:`router.relays.recovery`), their unicast connections
  (:mod:`router.relays.unicast`).
* :mod:`router.shell` - the trio shell, one nursery per router
  (:class:`router.shell.router.MultiRouter`): a task per endpoint TR socket
  (:mod:`router.shell.portal_task`), per link (:mod:`router.shell.link_task`;
  :mod:`router.shell.pair_link` is a side of a pair of endpoints, in memory),
  per proxy and relayed stream (the relays), the HTTP endpoint, the signals
  and the core's task (:mod:`router.shell.wake`); what a relay sees of the
  router (:mod:`router.shell.relay_site`); :mod:`router.shell.single` is the
  one-endpoint, one-peer router.
* The command: :mod:`router.cli`, :mod:`router.logs`.
"""
