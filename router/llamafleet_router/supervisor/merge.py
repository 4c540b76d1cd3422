"""One Prometheus exposition out of the workers' own: every sample labelled with its worker.

Pure: texts in, text out. Families are matched by name, and each keeps the HELP and TYPE of the first
worker that has it, so a family is described once however many workers report it. A worker whose
text does not parse is left out whole (a scrape of half a worker's families would show counters
dropping) and named in `unparsable`, for the caller to count.

A sample that already carries the label gets the worker's value, and its own is kept as
`exported_<label>`: what Prometheus does with a target label that collides with a scraped one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True)
class Merged:
    text: str
    #: Workers whose exposition did not parse (left out of `text`).
    unparsable: tuple[str, ...]


class _Families:
    """What `generate_latest` renders: anything with `collect()`."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def labelled(sample: Sample, label: str, value: str) -> Sample:
    labels = dict(sample.labels)
    if label in labels:
        labels[f"exported_{label}"] = labels[label]
    labels[label] = value
    return sample._replace(labels=labels)


def parse(text: str) -> list[Metric] | None:
    """The families of one exposition; None when it does not parse (the parser is lazy: read it all)."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, KeyError):
        return None


def merge_families(by_worker: Mapping[str, list[Metric]], label: str = "worker") -> list[Metric]:
    """The workers' families merged by name, in the order they first appear, samples in worker order."""
    merged: dict[str, Metric] = {}
    for worker, families in by_worker.items():
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type,
                                                    family.unit)
            elif into.type != family.type:
                continue  # workers of one pod run one version: only a mix-up gets here; keep the first
            into.samples.extend(labelled(s, label, worker) for s in family.samples)
    return list(merged.values())


def merge_expositions(by_worker: Mapping[str, str], label: str = "worker") -> Merged:
    """The text format (0.0.4) of every worker's samples, each with `label="<worker>"`."""
    parsed: dict[str, list[Metric]] = {}
    unparsable: list[str] = []
    for worker, text in by_worker.items():
        families = parse(text)
        if families is None:
            unparsable.append(worker)
        else:
            parsed[worker] = families
    text = generate_latest(_Families(merge_families(parsed, label))).decode()  # type: ignore[arg-type]
    return Merged(text, tuple(unparsable))
