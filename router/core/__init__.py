"""router.core: the router's protocol logic, sans-IO (no trio, no sockets beyond
address conversions, no clock: every input takes ``now``).

:mod:`router.core.router_core` (the control plane: one calling contract
for the whole router), :mod:`router.core.tr` (an endpoint portal's topic resolution, UM's wire
behaviour), :mod:`router.core.endpoint_portal` (that portal shared by the
links it serves), :mod:`router.core.bridge` (one link's view of a portal
joined to the peer; its typed outputs :mod:`router.core.bridge_outputs`, its
ACLs :mod:`router.core.bridge_acl`, its far side, our sources advertised,
:mod:`router.core.bridge_adverts`, and its near side, the peer's sources
proxied, :mod:`router.core.bridge_proxies`), :mod:`router.core.sessions` (proxies by transport
session), :mod:`router.core.routing` and :mod:`router.core.topology` (route
info, the map and its trees), :mod:`router.core.transit` (interest and
sources passed between peer links), :mod:`router.core.acl` and
:mod:`router.core.wildcard` (ACL decisions, patterns without backtracking),
:mod:`router.core.interest` (which interest, topics and patterns, wants a
topic: the one index and cache they are matched with),
:mod:`router.core.lbtrm` and :mod:`router.core.lbtru_fanout` (LBT-RM
proxies and the LBT-RU proxy source that re-publishes LBT-RM and LBT-RU
origins; how it reads its origin, :mod:`router.core.lbtru_origin`, and the
window budget an endpoint's proxies share, :mod:`router.core.lbtru_window`), :mod:`router.core.lbtru_upstream` (the LBT-RU proxy receiver of
an origin session), :mod:`router.core.fanout` (TCP sessions' fan-out
queues), :mod:`router.core.message_addresses` (the answer addresses and
DESTINATION headers of LBMC messages, read and written in place),
:mod:`router.core.request_maps` (requests and responses across routers:
request listeners, the requesters a response may go to),
:mod:`router.core.uim` (UIMs routed by domain). The peer-link protocol is its own sans-IO package,
:mod:`router.peerlink`.
"""
