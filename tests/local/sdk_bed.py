"""One `llamafleet up` with API keys, for the official SDKs and the request metrics: its keys, a client of
each SDK, and the gateway's `/metrics` read with the admin key.

The keys reach the in-process gateway through its settings' environment (`LLAMAFLEET_ROUTER_API_KEYS`,
`LLAMAFLEET_ROUTER_ADMIN_KEYS`), which `up` leaves to the router settings: auth is then on, as in a
deployment, so the SDKs' 401s can be checked too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.local.up_bed import Up, fleet_yaml, start_up, wait_health

MODEL = "tiny-dense"
#: Key names and keys. Each test sends with its own key name, so that its metrics are its own.
KEYS = {
    "chat": "sk-chat-4f1d9a", "cache": "sk-cache-2b8e61", "tools": "sk-tools-83c2e0",
    "messages": "sk-messages-b71a55", "tool-use": "sk-tool-use-e3a907", "errors": "sk-errors-0c9e44",
    "meter": "sk-meter-6d2f18", "ops": "sk-ops-a95b73",
}
ADMIN = "ops"
TIMEOUT_S = 120.0


@contextmanager
def sdk_fleet(folder: Path, binary: Path) -> Iterator[Up]:
    """1 pod x 2 slots of the tiny dense model, 8K tokens per slot (an agent's 12K-character prefix fits),
    no SharedPrefix: long prefixes are built on first sight, as for a real agent client."""
    config = folder / "fleet.yaml"
    config.write_text(fleet_yaml(binary, replicas=1, slots=2, context=8192))
    env = {"LLAMAFLEET_ROUTER_API_KEYS": ",".join(f"{name}:{key}" for name, key in KEYS.items()),
           "LLAMAFLEET_ROUTER_ADMIN_KEYS": ADMIN}
    with pytest.MonkeyPatch.context() as patch:  # `up` reads them at start; the test's own env is kept
        for name, value in env.items():
            patch.setenv(name, value)
        running = start_up(folder, config, "run")
    try:
        with httpx.Client(timeout=30.0) as http:
            wait_health(http, running.url, timeout=240)
        yield running
    finally:
        running.terminate()


def openai_client(up: Up, key_name: str, *, key: str | None = None) -> openai.OpenAI:
    """The official client as an application configures it for a compatible server; no retries, so
    every error the gateway answers reaches the test."""
    return openai.OpenAI(base_url=up.url + "/v1", api_key=key if key is not None else KEYS[key_name],
                         max_retries=0, timeout=TIMEOUT_S)


def anthropic_client(up: Up, key_name: str, *, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.url, api_key=key if key is not None else KEYS[key_name],
                               max_retries=0, timeout=TIMEOUT_S)


class Metrics:
    """The gateway's /metrics at one moment, as {(sample name, sorted labels): value}."""

    def __init__(self, up: Up) -> None:
        resp = httpx.get(up.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[ADMIN]}"},
                         timeout=30.0)
        assert resp.status_code == 200, resp.text
        self.text = resp.text
        self.values = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        """The sum over the samples named `name` whose labels include `labels` (0 when none)."""
        wanted = set(labels.items())
        return sum(v for (n, have), v in self.values.items() if n == name and wanted <= set(have))

    def statuses(self, key_name: str) -> dict[str, float]:
        """`requests_total` of one key name, by HTTP status."""
        out: dict[str, float] = {}
        for (name, labels), value in self.values.items():
            found = dict(labels)
            if name == "llamafleet_router_requests_total" and found.get("key") == key_name:
                out[found["status"]] = out.get(found["status"], 0) + value
        return out


def assert_no_client_errors(up: Up, key_name: str, answered: int) -> None:
    """Every request this key sent was answered 200, all `answered` of them, and no stream broke."""
    metrics = Metrics(up)
    assert metrics.statuses(key_name) == {"200": answered}, metrics.statuses(key_name)
    assert metrics.value("llamafleet_router_stream_errors_total") == 0
