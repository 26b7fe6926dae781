"""The router's trio shell: one nursery per router
(:class:`router.shell.router.MultiRouter`), a task per TR socket, link, proxy and
relayed stream, and the core's task that carries out the core's outputs."""
