"""What this pod's llama-server build accepts, from the help text the detector init container wrote.

The agent is the pod's reporter: it already runs beside llama-server, answers the operator, and shares the
pod's `/tmp` with the detector, whereas the operator cannot read a pod's files. The text is parsed once
it exists (`llamafleet_core.features`, pure) and cached: an image's help never changes under a running
pod. While the file is missing (the detector has not run, or this agent was started without one) every
call looks again, so a late file is still picked up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamafleet_agent.metrics import AgentMetrics
from llamafleet_core.features import FEATURE_FLAGS, ServerFeatures, parse_help, summary

MAX_HELP_BYTES = 1 << 20  # llama-server's help is ~60 KB; anything far larger is not it


class FeatureReport:
    def __init__(self, path: Path | None, metrics: AgentMetrics) -> None:
        self._path = path
        self._metrics = metrics
        self._features: ServerFeatures | None = None
        self._message = "no help file configured" if path is None else "help file not written yet"
        self._final = path is None

    def load(self) -> None:
        """Read and parse the help file once it exists; publish the gauges."""
        if self._final or self._path is None:
            return
        try:
            with self._path.open("rb") as f:
                text = f.read(MAX_HELP_BYTES).decode("utf-8", "replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            self._message = f"help file unreadable: {exc}"
            return
        self._final = True
        self._features = parse_help(text)
        if self._features is None:
            # Say what the detector got instead (a shell error, a missing library): the status shows it.
            first = next((line.strip() for line in text.splitlines() if line.strip()), "empty")
            self._message = f"not llama-server help: {first[:200]}"
        else:
            self._message = summary(self._features)
        self._metrics.features_known.set(1 if self._features is not None else 0)
        for name in FEATURE_FLAGS:
            on = self._features is not None and bool(getattr(self._features, name))
            self._metrics.server_feature.labels(name).set(1 if on else 0)

    @property
    def features(self) -> ServerFeatures | None:
        self.load()
        return self._features

    def to_json(self) -> dict[str, Any]:
        """`{"known", "slotAttach", "cachePrefix", "message"}`, the shape the operator records."""
        features = self.features
        base = features.to_json() if features is not None else ServerFeatures().to_json()
        return {"known": features is not None, **base, "message": self._message}
