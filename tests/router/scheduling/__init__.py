"""Unit tests of the scheduling pipeline: hand-built endpoints, in-test fakes for index and leases."""
