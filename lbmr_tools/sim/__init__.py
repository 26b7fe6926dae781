"""lbmr-sim: play N Ultra Messaging contexts' topic resolution on loopback.

Modules, bottom up:

* :mod:`.context`: :class:`Context`, a sans-IO model of one UM context's UDP
  topic resolution (no sockets, no clock), either unicast through lbmrds or
  multicast to a group: it owns sources (topic -> transport address) and
  receivers (topics), and is driven by ``tick(now)`` (the datagrams due at
  ``now``), ``receive(data, now, src)`` (an incoming TR datagram; returns
  immediate replies) and ``next_deadline()``. Times are seconds on any
  monotonic clock. The cadence, destinations and datagram packing are UM's
  model in :mod:`lbmr_proto.um` (configurable through :class:`Timing`).
* :mod:`.config`: :class:`SimConfig` (what a run plays), its checks, and
  where sources and receivers go (:func:`build_contexts`).
* :mod:`.netif`: address checks, the multicast interface check and the
  multicast socket set-up.
* :mod:`.runner`: :func:`run_sim`, the trio shell: one UDP socket per
  context, either on a loopback address talking to one or more lbmrds, or
  bound to a multicast group's port and joined to the group (multicast mode;
  needs an interface with multicast enabled, e.g. ``lo`` inside a network
  namespace), until every receiver has resolved or ``duration`` has passed.
  It uses :func:`trio.current_time`, so it runs unchanged on a virtual clock
  (``autojump_clock`` in tests).
* :mod:`.report`: results, text and JSON reports, the exit status.
* :mod:`.cli`: ``main``, the ``lbmr-sim`` command; see lbmr-sim(1).
* :mod:`.dataplane`: the data endpoints. With data
  (``SimConfig.data_bytes`` / ``data_datagrams``) every source also serves
  numbered data on the transport address it advertises (TCP, or our
  simplified LBT-RU-like datagram protocol), and with ``verify_data`` every
  receiver, once resolved, connects to (registers with) the address it
  resolved and verifies what arrives. TCP sources can also send requests
  and keep a retention buffer, and their receivers respond, join late and
  repair gaps by OTR, through each context's request port
  (``SimConfig.requests``, ``retention``, ``late_join``, ``otr``;
  :mod:`.dataplane.umtcp`, :mod:`.dataplane.uim`); LBT-RU receivers NAK their
  gaps. The tests use it too; the router never does.

Everything the modules define is importable from here.
"""

from lbmr_proto.um import (
    RCV_ALIVE,
    SRC_ALIVE,
    TIMING_FIELDS,
    UM_VERSION,
    VERSION_FLAGS,
    Schedule,
    Timing,
    make_otid,
    round_robin,
)

from .cli import (
    SIZE_SUFFIXES,
    config_from_params,
    main,
    parse_args,
    parse_group,
    parse_hostport,
    parse_size,
    parse_timing,
)
from .config import (
    DEFAULT_DATA_MESSAGE_SIZE,
    DEFAULT_DATA_RATE,
    LBTRM_DEST_PORT,
    LBTRM_GROUP,
    MAX_CONTEXTS,
    MAX_DATA_DATAGRAMS,
    MC_GROUP,
    MC_INTERFACE,
    MC_PORT,
    PORT_BASES,
    TRANSPORTS,
    SimConfig,
    bind_addresses,
    build_contexts,
    check_config,
    check_data_config,
    daemon_list,
    make_transport,
    receiver_topics,
    serves_data,
    source_ip_of,
    source_placement,
    source_port_base,
    topic_names,
)
from .context import (
    DEFAULT_DAEMON,
    REQUEST_PORT_BASE,
    Context,
    Datagram,
    Receiver,
    Source,
    transport_text,
)
from .netif import (
    LOOPBACK,
    MULTICAST,
    Interface,
    MulticastUnavailable,
    in_initial_netns,
    multicast_interface,
    open_multicast_socket,
)
from .report import (
    ReceiverResult,
    SentDatagram,
    SimResult,
    data_outcome,
    data_source_report,
    data_text,
    exit_status,
    receiver_results,
    render,
    render_text,
)
from .runner import MIN_STEP, run_sim
