"""Test bed: real redis-server and real llama-server processes, started on free loopback ports.

Fixtures live in `tests/fixtures/` (one module per component of the bed) and are loaded as plugins;
`bed_guard` checks that tests marked neither `llama` nor `models` need nothing of the llama-server bed.
"""

pytest_plugins = [
    "tests.fixtures.redis", "tests.fixtures.redis_ha", "tests.fixtures.redis_cluster", "tests.fixtures.llama",
    "tests.fixtures.bed_guard",
]
