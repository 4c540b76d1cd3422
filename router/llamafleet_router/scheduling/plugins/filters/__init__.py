"""Filters: drop endpoints that must not (or should not) take the request."""
