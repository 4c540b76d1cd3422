"""Write the openAPIV3Schema of one version of a CRD file, without descriptions, as JSON (how the schemas
beside this file were made from their projects' released CRDs; see README.md there).

    python -m tests.chart.schemas.strip CRD.yaml VERSION OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def main(argv: list[str]) -> int:
    crd_path, version, out = argv
    crd = yaml.safe_load(Path(crd_path).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = without_descriptions(served["schema"]["openAPIV3Schema"])
    Path(out).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
