"""The router end to end: several routers, real processes, network namespaces."""
