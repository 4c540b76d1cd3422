"""The kind end-to-end test as a pytest module: `pytest e2e` (not part of `make test`, which runs tests/).

Skips with one line where Docker (an engine, not only the client) or kind is absent.
"""

from __future__ import annotations

import pytest

from e2e import kind_e2e

REASON = kind_e2e.missing_prerequisite()
if REASON is not None:
    pytest.skip(f"kind end-to-end test: {REASON}", allow_module_level=True)


@pytest.mark.slow
def test_helm_install_warms_a_shared_prefix_that_every_session_reuses() -> None:
    """helm install, a CPU LlamaFleet and a SharedPrefix reach Ready, and agent sessions sent through the
    gateway reuse at least 80% of their prompt tokens (the shared prefix) from the first session on."""
    assert kind_e2e.main() == 0
