"""The router's data plane on trio: the relay of each endpoint on each link
(:class:`router.relays.endpoint_relay.Relay`) and the transport relays it picks
from one table, all implementing :class:`router.relays.interface.TransportRelay`.
They move bytes; what is decided about the bytes is in :mod:`router.core`."""
