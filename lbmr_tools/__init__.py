"""lbmr_tools: command-line tools over the LBMR wire format (lbmr-inspect, ...)."""
