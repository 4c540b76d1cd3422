"""The chart's ValidatingAdmissionPolicy, evaluated with cel-python the way the API server evaluates it.

Shared by the admission tests (tests/security/test_fleet_admission.py) and the kind e2e's offline twin
(tests/chart/test_e2e_install.py), which checks that what the e2e expects the cluster to refuse is refused.
"""

from __future__ import annotations

from typing import Any

import celpy


class RenderedPolicy:
    """The chart's ValidatingAdmissionPolicy, evaluated the way the API server does (variables first,
    then every validation with `object` and `variables`; all must be true)."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        env = celpy.Environment()
        self.variables = [(v["name"], env.program(env.compile(v["expression"])))
                          for v in manifest["spec"]["variables"]]
        self.validations = [(v["message"], env.program(env.compile(v["expression"])))
                            for v in manifest["spec"]["validations"]]

    def refusals(self, fleet: dict[str, Any]) -> list[str]:
        obj = celpy.json_to_cel(fleet)
        values = {name: prog.evaluate({"object": obj}) for name, prog in self.variables}
        activation = {"object": obj, "variables": celpy.json_to_cel({})}
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in values.items()})
        out = []
        for message, prog in self.validations:
            verdict = prog.evaluate(activation)
            assert isinstance(verdict, celpy.celtypes.BoolType), (message, verdict)  # an error is no answer
            if not verdict:
                out.append(message)
        return out
