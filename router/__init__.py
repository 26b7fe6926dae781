"""router: lbmr-router, a Topic Resolution Domain (TRD) router in the role of UM's DRO.

The map, bottom up:

* :mod:`router.core` — the protocol logic, sans-IO (a folder; see its doc):
  topic resolution of an endpoint portal and its sharing among links, the
  bridge of a link, proxy sessions, routing and transit, ACLs and patterns,
  the LBT-RM and LBT-RU proxies' state machines.
* :mod:`router.peerlink` — the peer-link protocol, sans-IO (frames, codec,
  connection, writer queue, streams; spec in ``router/PEERLINK.md``).
* The trio shell: :mod:`router.portal_task` (an endpoint's TR socket and
  timers), :mod:`router.daemon` (a portal link: its link, bridge and relay),
  :mod:`router.multi` (a router of several portals and its routing),
  :mod:`router.link` (one connected peer link), :mod:`router.relay`,
  :mod:`router.lbtrm_relay` and :mod:`router.splice` (the data relay).
* Configuration and command: :mod:`router.config_model`,
  :mod:`router.config_grammar`, :mod:`router.acl_config`,
  :mod:`router.config` (the XML file), :mod:`router.logs`, :mod:`router.cli`.
"""
