"""Test bed: real redis-server and real llama-server processes, started on free loopback ports.

Fixtures live in `tests/fixtures/` (one module per component of the bed) and are loaded as plugins.
"""

pytest_plugins = ["tests.fixtures.redis", "tests.fixtures.llama"]
