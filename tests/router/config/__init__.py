"""Tests of the router's configuration: loading and checking the file, and each setting taking effect."""
