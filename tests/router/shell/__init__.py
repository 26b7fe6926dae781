"""Tests of the router's trio shell: links, portal and link tasks, endpoint pairs, the daemon."""
