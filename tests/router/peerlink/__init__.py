"""Tests of router/peerlink/: the peer-link protocol, sans-IO."""
