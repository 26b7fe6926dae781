"""router: lbmr-router, a Topic Resolution Domain (TRD) router in the role of UM's DRO.

The map, bottom up:

* :mod:`router.core` — the protocol logic, sans-IO (a folder; see its doc):
  :class:`router.core.router_core.RouterCore`, the router's control plane
  with one calling contract (TR datagrams, link up / frames / down, proxies
  listening, sessions ended, ticks in; typed outputs drained), built of the
  topic resolution of each endpoint portal and its sharing among links, the
  bridge of each endpoint on each link, proxy sessions, routing and transit,
  ACLs and patterns, the fan-out queues, the LBT-RM and LBT-RU proxies' and
  the LBT-RU proxy receiver's state machines.
* :mod:`router.peerlink` — the peer-link protocol, sans-IO (frames, codec,
  connection, writer queue, streams; spec in ``router/PEERLINK.md``).
* The trio shell, one nursery per router (:mod:`router.multi`): a task per
  endpoint TR socket (:mod:`router.portal_task`), per link
  (:mod:`router.link_task`; :mod:`router.link` is a connected peer link,
  built of :mod:`router.link_stream` (the state of each relayed stream, its
  pipes and the order of its bytes), :mod:`router.link_writer` (the queue
  and the writer task) and :mod:`router.link_reader` (the zero-copy reader);
  :mod:`router.pair_link` a side of a pair of endpoints, in memory), per
  proxy and relayed stream (:mod:`router.relay`, the relay of an endpoint
  on a link: relay ports, proxies, and the dispatch, by one table, to the
  relays of each transport, all of one interface (:mod:`router.transport_relay`:
  the interface, its lifecycle and the relays' typed settings):
  :mod:`router.fanout_relay` and :mod:`router.relay_tcp` for TCP,
  :mod:`router.lbtru_relay` and :mod:`router.relay_ru` for LBT-RU,
  :mod:`router.lbtrm_relay` for LBT-RM; :mod:`router.splice` is zero copy;
  each relay sees the router through :mod:`router.relay_site`), and the
  core's task (:mod:`router.wake`); :mod:`router.daemon` is the
  one-endpoint, one-peer router.
* Configuration: :mod:`router.config` reads and checks the XML file
  (``load_config``, ``parse_config``; the layer's public names), built of
  :mod:`router.config_model` (the settings), :mod:`router.config_grammar`
  (the DTD and its messages), :mod:`router.config_checker` (the error and
  warning collector, the shared value parsers), the per-element checkers of
  :mod:`router.config_endpoint` (endpoint, topic resolution, relay, LBT-RM),
  :mod:`router.config_peer` (peer, TLS files) and :mod:`router.acl_config`
  (``<acl>``), and :mod:`router.config_cross_checks` (across portals).
* Command: :mod:`router.logs`, :mod:`router.cli`.
"""
