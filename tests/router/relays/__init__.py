"""Tests of the router's data-plane relays (TCP, LBT-RU, LBT-RM, fan-out, splice)."""
