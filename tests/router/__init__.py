"""lbmr-router's tests, grouped as the router's code is: ``core`` (the sans-IO
core), ``peerlink`` (the peer-link protocol), ``config`` (loading and checking
the file, and each setting taking effect), ``relays`` (the data-plane relays),
``shell`` (the trio shell: links, tasks, the daemon) and ``system`` (several
routers, processes or network namespaces end to end). Shared drivers live in
``tests.router.helpers``.

This package is ``tests.router``; the project's package stays ``router``."""
