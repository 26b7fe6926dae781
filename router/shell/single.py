"""A router of one endpoint portal and one peer link, on trio: the form the
router had at first, still handy for tests, benchmarks and embedding. It is a
:class:`router.shell.router.MultiRouter` of that configuration, with the one unit's
link, bridge, portal view and counters at hand."""

from __future__ import annotations

from ..config.model import EndpointConfig, PeerConfig, RouterConfig
from .router import MultiRouter

__all__ = ["Router"]


class Router(MultiRouter):
    """``await Router(name, endpoint, peer).run(task_status=...)`` in a nursery;
    reports as :class:`MultiRouter` does (``tr`` and ``peer``: the one link's). ``metrics``: ``(address, port)`` of the HTTP endpoint or None;
    ``handle_signals``: SIGUSR1 dump, SIGTERM/SIGINT stop."""

    def __init__(self, name: str, endpoint: EndpointConfig, peer: PeerConfig, *,
                 metrics: tuple[str, int] | None = None, handle_signals: bool = False) -> None:
        super().__init__(RouterConfig("", name, (endpoint,), (peer,), metrics=metrics),
                         handle_signals=handle_signals)
        self.name, self.endpoint, self.peer = name, endpoint, peer
        self.unit = self.links[0]

    @property
    def link(self):
        return self.unit.link

    @property
    def bridge(self):
        return self.unit.bridge

    @property
    def relay(self):
        return self.unit.relay

    @property
    def tr(self):
        return self.unit.tr

    @property
    def tr_sock(self):
        return self.portals[self.endpoint.name].sock

    @property
    def counters(self):
        return self.unit.counters

    async def disconnect(self, reason: str, timeout: float = 2.0) -> None:
        """Graceful disconnect of the peer link, bounded in time."""
        await self.unit.task.disconnect(reason, timeout)
