"""NOTES.txt as `helm install` would print it, offline: `helm template` skips NOTES.txt, so a copy of the
chart renders the real file's text through `tpl` into a ConfigMap, with the same values and context."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.chart.conftest import CHART, Helm, one

WRAPPER = """apiVersion: v1
kind: ConfigMap
metadata: {name: notes-under-test}
data:
  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}
"""


def render_notes(helm: Helm, folder: Path, *sets: str) -> str:
    chart = folder / "chart"
    shutil.copytree(CHART, chart)
    # .Files cannot read templates/: the copy keeps the text at the chart's root.
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text(WRAPPER)
    objs = helm.template(chart=chart, sets=sets)
    text: str = one(objs, "ConfigMap", "notes-under-test")["data"]["notes"]
    return text
