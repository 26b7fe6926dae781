"""lbmrd: the unicast topic-resolution daemon (a drop-in for UM's lbmrd).

Sans-IO: :mod:`lbmrd.relay` (the relay decisions), :mod:`lbmrd.clients`
(the client table), :mod:`lbmrd.nat` (domains and rewrite rules). The trio
shell: :mod:`lbmrd.server` (one socket, one nursery), :mod:`lbmrd.fanout`
(sendmmsg/recvmmsg batches), :mod:`lbmrd.metrics` (HTTP). :mod:`lbmrd.config`
reads the XML file, :mod:`lbmrd.cli` is the command.
"""
