"""lbmrd: unicast topic-resolution daemon (lands with the lbmrd issue)."""
