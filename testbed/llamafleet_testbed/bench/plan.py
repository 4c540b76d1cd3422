"""What a seed-table run measures (`Plan`) and the prompts it sends (`Profiles`, FLEET.yaml's documents).

Apart from the runner (`run`) because these are decided before any server starts and are pure but for
`prefix_tokens_on`, which asks a started server how many tokens a prefix size makes; other benchmarks
(`bench/` at the top) take the same plan and calibration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamafleet_core import http_pool
from llamafleet_testbed.workload import PREFIX_TOKENS, AgentProfile, WorkloadSpec, make_profile, next_day

FLEET = "bench"


@dataclass(frozen=True)
class Plan:
    """What one run measures; `--quick` shrinks it."""

    models: tuple[str, ...] = ("tiny-dense", "tiny-hybrid")
    repeats: int = 5  # of the 14K third-session runs (as they are, and declared)
    sizes: tuple[int, ...] = PREFIX_TOKENS  # the first is the "as they are" size
    size_repeats: int = 1  # of each larger size
    mixed_sessions: int = 50
    mixed_prefix_chars: int = 12_000
    pods: int = 2
    slots: int = 4
    context_per_slot: int = 36_864  # 32K-token prefix plus a conversation
    threads: int = 1
    # The fleet's pods: off on CPU (`llamafleet_core.devices`); the plain pods keep it on (setups.py).
    flash_attention: str = "off"
    setups: tuple[str, ...] = ("plain", "sglang", "llamafleet", "patched")


@dataclass
class Profiles:
    """The prefixes of one model's run, by scenario (sizes calibrated against the model's server)."""

    chars: dict[int, int]
    as_is: list[AgentProfile] = field(default_factory=list)
    declared: list[AgentProfile] = field(default_factory=list)
    sizes: dict[int, list[AgentProfile]] = field(default_factory=dict)
    day1: AgentProfile | None = None
    day2: AgentProfile | None = None
    ram_day1: AgentProfile | None = None  # the later day from RAM (no restart): its own workspace
    ram_day2: AgentProfile | None = None
    other: AgentProfile | None = None  # the agent whose sessions take every slot in between
    kv: AgentProfile | None = None  # three sessions at once: KV cells and decode


def fleet_docs(model: str, plan: Plan, declared: list[AgentProfile],
               patched_binary: str | None = None) -> list[dict[str, Any]]:
    """FLEET.yaml's documents for a model, with one SharedPrefix per declared profile (pure).
    `patched_binary`: setup (d), the patched build's pods; `kvUnified` is left unset, as a user leaves it,
    so the pods run one KV pool exactly because the build attaches (podspec.for_image)."""
    fleet: dict[str, Any] = {
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "LlamaFleet", "metadata": {"name": FLEET},
        "spec": {
            "model": {"name": model, "file": f"{model}.gguf", "source": {"hostPath": "/models"}},
            "image": "llamafleet/llama-server:cpu", "replicas": plan.pods, "slots": plan.slots,
            "contextPerSlot": plan.context_per_slot, "cacheTypeK": "f16", "cacheTypeV": "f16",
            "flashAttention": plan.flash_attention, "ctxCheckpoints": 128,
        },
        "local": {"model": model, "threads": plan.threads},
    }
    if patched_binary is not None:
        fleet["local"]["llamaServer"] = patched_binary
    prefixes = [{
        "apiVersion": "llamafleet.io/v1alpha1", "kind": "SharedPrefix", "metadata": {"name": f"declared-{i}"},
        "spec": {"fleetRef": {"name": FLEET}, "tools": list(p.tools),
                 "messages": [{"role": "system", "content": p.system_prompt}], "pin": True},
    } for i, p in enumerate(declared)]
    return [fleet, *prefixes]


def make_profiles(chars: dict[int, int], plan: Plan) -> Profiles:
    """Every scenario's own prefix: another seed and workspace, so no scenario helps another."""
    base = chars[plan.sizes[0]]
    out = Profiles(chars)

    def spec(seed: int, size: int, workspace: str) -> WorkloadSpec:
        return WorkloadSpec(prefix_chars=size, seed=seed, workspace=f"/home/dev/{workspace}")
    out.as_is = [make_profile(spec(100 + r, base, f"as-is-{r}")) for r in range(plan.repeats)]
    out.declared = [make_profile(spec(200 + r, base, f"declared-{r}")) for r in range(plan.repeats)]
    out.sizes = {s: [make_profile(spec(300 + 10 * i + r, chars[s], f"size-{s}-{r}")) for r in
                     range(plan.size_repeats)] for i, s in enumerate(plan.sizes[1:])}
    day = spec(500, base, "days")
    out.day1, out.day2 = make_profile(day), make_profile(next_day(day))
    ram_day = spec(600, base, "ram-days")
    out.ram_day1, out.ram_day2 = make_profile(ram_day), make_profile(next_day(ram_day))
    out.other, out.kv = make_profile(spec(700, base, "other")), make_profile(spec(800, base, "kv"))
    return out


def prefix_tokens_on(server: str) -> Callable[[int], int]:
    def measure(chars: int) -> int:
        profile = make_profile(WorkloadSpec(prefix_chars=chars))
        with http_pool.sync_client(timeout=120.0) as http:
            body = {"messages": profile.messages("x"), "tools": list(profile.tools)}
            prompt = http.post(server + "/apply-template", json=body).json()["prompt"]
            prompt = prompt[: prompt.rindex("<|im_start|>user")]  # tokens before the first user message
            return len(http.post(server + "/tokenize", json={"content": prompt, "add_special": True})
                       .json()["tokens"])
    return measure
