"""`--workers N` without processes: the metrics merge, the settings rule, the restart delays."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from llamafleet_router.settings import RouterSettings
from llamafleet_router.supervisor.merge import merge_expositions
from llamafleet_router.supervisor.processes import restart_delay_s


def exposition(requests: int, seconds: float, *, extra_label: str | None = None) -> str:
    """What one worker's /metrics serves (prometheus_client's own text, as the gateway's)."""
    registry = CollectorRegistry()
    counter = Counter("lf_requests_total", "Requests answered.", ["status"], registry=registry)
    counter.labels("200").inc(requests)
    Histogram("lf_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry).observe(seconds)
    gauge = Gauge("lf_in_flight", 'In flight "now"\nper pod \\ slot.', ["worker"] if extra_label else [],
                  registry=registry)
    (gauge.labels(extra_label) if extra_label else gauge).set(3)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_sample_gets_its_workers_label_and_each_family_is_described_once() -> None:
    merged = merge_expositions({"0": exposition(3, 0.05), "1": exposition(5, 0.5)})
    assert merged.unparsable == ()
    for family in ("lf_requests_total", "lf_seconds", "lf_in_flight"):
        assert merged.text.count(f"# TYPE {family} ") == 1, family
        assert merged.text.count(f"# HELP {family} ") == 1, family
    found = samples(merged.text)
    assert found[("lf_requests_total", frozenset({("status", "200"), ("worker", "0")}))] == 3
    assert found[("lf_requests_total", frozenset({("status", "200"), ("worker", "1")}))] == 5
    assert found[("lf_seconds_bucket", frozenset({("le", "0.1"), ("worker", "0")}))] == 1
    assert found[("lf_seconds_bucket", frozenset({("le", "0.1"), ("worker", "1")}))] == 0
    assert found[("lf_seconds_count", frozenset({("worker", "1")}))] == 1
    types = {f.name: f.type for f in text_string_to_metric_families(merged.text)}
    assert types["lf_requests"] == "counter" and types["lf_seconds"] == "histogram"


def test_the_merge_keeps_help_escapes_and_the_samples_of_every_worker() -> None:
    """What one worker alone would show, the merge shows for each worker: no sample lost or changed."""
    texts = {"0": exposition(1, 2.0), "1": exposition(2, 0.01), "2": exposition(7, 0.3)}
    found = samples(merge_expositions(texts).text)
    for worker, text in texts.items():
        for (name, labels), value in samples(text).items():
            assert found[(name, labels | {("worker", worker)})] == value
    help_line = [line for line in merge_expositions(texts).text.splitlines() if "HELP lf_in_flight" in line]
    assert help_line == ['# HELP lf_in_flight In flight "now"\\nper pod \\\\ slot.']


def test_a_worker_label_already_there_is_kept_as_exported_worker() -> None:
    found = samples(merge_expositions({"1": exposition(1, 0.1, extra_label="pool-a")}).text)
    assert found[("lf_in_flight", frozenset({("worker", "1"), ("exported_worker", "pool-a")}))] == 3


def test_a_worker_whose_text_does_not_parse_is_left_out_and_named() -> None:
    merged = merge_expositions({"0": exposition(4, 0.1), "1": "lf_requests_total{status=200 oops\n"})
    assert merged.unparsable == ("1",)
    assert {dict(labels)["worker"] for _, labels in samples(merged.text)} == {"0"}


def test_no_worker_answering_merges_to_an_empty_exposition() -> None:
    assert merge_expositions({}).text == ""


def test_more_than_one_worker_needs_the_redis_index() -> None:
    """With the memory index each worker would keep a private index and private leases: two workers
    could pin two requests to one slot. The settings refuse it, naming the fix."""
    with pytest.raises(ValidationError, match="needs index=redis"):
        RouterSettings(workers=2)
    with pytest.raises(ValidationError, match="needs index=redis"):
        RouterSettings(workers=2, redis_url="redis://r:6379/0", index="memory")
    assert RouterSettings(workers=2, redis_url="redis://r:6379/0").workers == 2
    assert RouterSettings().workers == 1
    with pytest.raises(ValidationError):
        RouterSettings(workers=0, redis_url="redis://r:6379/0")


def test_the_cli_prints_the_memory_index_refusal_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from llamafleet_router.cli import main

    assert main(["--workers", "2", "--index", "memory"]) == 2
    out = capsys.readouterr().out
    assert "invalid settings" in out and "workers=2 needs index=redis" in out


def test_workers_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFLEET_ROUTER_WORKERS", "4")
    monkeypatch.setenv("LLAMAFLEET_ROUTER_REDIS_URL", "redis://r:6379/0")
    assert RouterSettings().workers == 4


def test_restart_delays_double_with_quick_exits_up_to_the_cap() -> None:
    assert [restart_delay_s(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay_s(1) == restart_delay_s(0)  # after a stable run: the shortest delay
