"""router: Topic Resolution Domain router (lands with the router issue)."""
