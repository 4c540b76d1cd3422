"""schemathesis against the gateway's own OpenAPI document, bounded, over a fake pod.

For every public route: generated bodies (valid and invalid by the schema) never get a 5xx (503 is the
documented "no pod" answer and cannot happen here: the pod is up), every answer conforms to the
document (status, content type, error shape), and afterwards no request is still counted in flight and
no slot lease is held.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from llamafleet_router.api.openapi import openapi_document
from tests.fuzz.allow_list import off_the_list
from tests.fuzz.served import AUTH, Served, served_gateway

SCHEMA = schemathesis.openapi.from_dict(openapi_document())
POSTS = [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/messages", "POST"),
         ("/v1/messages/count_tokens", "POST"), ("/v1/responses", "POST"), ("/v1/embeddings", "POST")]
GETS = [("/v1/models", "GET"), ("/v1/models/{model_id}", "GET"), ("/health", "GET"), ("/openapi.json", "GET")]
CASES = [(p, m, GenerationMode.POSITIVE) for p, m in POSTS + GETS] + [
    (p, m, GenerationMode.NEGATIVE) for p, m in POSTS]  # GETs take no input to violate
# The gateway checks only what it relies on and passes the rest to llama-server, so "accepted a body the
# schema forbids" (an unknown role) and "rejected a body the schema allows" (400.0 as a token id) are
# not defects of the gateway; every other check runs (no 5xx, statuses, content types, error shapes).
EXCLUDED = [negative_data_rejection, positive_data_acceptance]
FUZZ = settings(max_examples=30, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_gateway() as s:
        yield s


def test_the_served_document_is_the_one_fuzzed(served: Served) -> None:
    """`GET /openapi.json` answers the document, without a key (it is public, like /health)."""
    resp = httpx.get(served.url + "/openapi.json")
    assert resp.status_code == 200 and resp.json() == openapi_document()


@pytest.mark.parametrize(("path", "method", "mode"), CASES)
def test_no_server_error_and_answers_conform_when_fuzzed(
    served: Served, path: str, method: str, mode: GenerationMode,
) -> None:
    """Bounded schemathesis run: 0 5xx, 0 non-conforming answers, 0 leaked in-flight counts or leases,
    0 bodies forwarded to the pod with a field outside the route's allow-list."""
    operation = SCHEMA[path][method]
    statuses: list[int] = []
    before = len(served.received)  # the fake pod's bodies; this run's all went to `path`

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=served.url, headers=AUTH, timeout=15)
        statuses.append(response.status_code)
        assert response.status_code < 500, (response.status_code, response.text[:500])
        case.validate_response(response, excluded_checks=EXCLUDED)

    run()
    assert statuses, "nothing was generated"
    assert served.leaks() == (0, 0)
    assert served.settings is not None
    assert off_the_list([(path, body) for body in served.received[before:]], served.settings, "fuzz") == []
