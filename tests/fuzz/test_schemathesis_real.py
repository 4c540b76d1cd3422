"""schemathesis against the gateway in front of a REAL llama-server, bounded, with what reached the server
recorded.

A recording pass-through proxy (`recording_proxy.py`) sits between the gateway and the server: it
forwards bytes unchanged and keeps every body it forwarded. For every POST route, generated bodies
(valid and invalid by the schema, `EXAMPLES` of each) get no 5xx from the gateway, whatever the real
server makes of what passed, and no body that reached the server has a top-level field outside the
route's allow-list (`api/fields.py`, as the gateway's own settings extend it: `allow_list.py`).
Answers are short: the key's length cap is `CAP` tokens, so the whole run stays within a couple of
minutes on two cores.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.fixtures.llama import StartLlamaServer, TinyModels
from tests.fuzz.allow_list import off_the_list
from tests.fuzz.recording_proxy import RecordingProxy
from tests.fuzz.served import AUTH, Served, served_gateway
from tests.fuzz.test_schemathesis import POSTS, SCHEMA

pytestmark = [pytest.mark.llama]

MODEL = "tiny-dense"
CAP = 4  # max_tokens_per_request: every generation on the tiny model stays a few tokens long
EXAMPLES = 15
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
KEY = "fuzz"  # the served gateway's key name (served.py)


def fuzz(served: Served, path: str, mode: GenerationMode) -> list[int]:
    """One bounded run of `path` in `mode`; the statuses it got (asserting none is a 5xx)."""
    statuses: list[int] = []

    @FUZZ
    @given(case=SCHEMA[path]["POST"].as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=served.url, headers=AUTH, timeout=60)
        statuses.append(response.status_code)
        assert response.status_code < 500, (path, response.status_code, response.text[:500])

    run()
    return statuses


def test_fuzzing_a_real_pod_gets_no_5xx_and_forwards_only_allowed_fields(
    start_llama_server: StartLlamaServer, tiny_models: TinyModels,
) -> None:
    server = start_llama_server(tiny_models.dense, slots=2, extra_args=("-a", MODEL))
    proxy = RecordingProxy(server.url)
    overrides: dict[str, Any] = {"extra_fields": [], "max_tokens_per_request": [str(CAP)]}
    with served_gateway(proxy, **overrides) as served:
        assert served.settings is not None
        answered: dict[str, list[int]] = {}
        for path, _ in POSTS:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                answered[f"{path} {mode.value}"] = fuzz(served, path, mode)
        assert served.leaks() == (0, 0)
    assert all(answered.values()), answered  # every run generated requests
    reached = {r.path for r in proxy.forwarded if r.method == "POST"}
    # Generated bodies did reach the server (the property is not vacuous); few valid Anthropic bodies
    # come out of 15 examples, so /v1/messages may have none.
    assert {"/v1/chat/completions", "/v1/completions", "/v1/messages"} <= reached, (reached, answered)
    posted = [(r.path, r.json_body()) for r in proxy.forwarded if r.method == "POST"]
    assert off_the_list(posted, served.settings, KEY) == []
