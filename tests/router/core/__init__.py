"""Tests of router/core/: the sans-IO core (topic resolution, bridge, routing, fan-out cores)."""
