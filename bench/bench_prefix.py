"""Cost of `chat_identity` on an agent-sized request (18 tool schemas, a long system prompt, ~60K chars).

Prints p50/p99 over many runs with a warm template cache, for both templates in the llama.cpp tree,
for a first turn (whose session-prefix renders the cache serves) and for a fresh multi-turn history
(nothing cached but the compiled template), plus the hashing cost alone.

    .venv/bin/python bench/bench_prefix.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from llamafleet_core.prefix import ChatTemplate, TemplateCache, block_chain, chat_identity
from llamafleet_testbed.llama_build import source_dir

TEMPLATES = ("Qwen3.5-4B.jinja", "Qwen-Qwen3-0.6B.jinja")


def agent_tools(n: int = 18, rng: random.Random | None = None) -> list[dict[str, Any]]:
    """Tool schemas shaped like a real agent client's: long descriptions, nested parameters."""
    rng = rng or random.Random(7)
    words = [
        "file", "path", "read", "write", "search", "pattern", "command",
        "output", "directory", "result", "line", "edit", "text",
    ]
    tools = []
    for i in range(n):
        props = {
            f"param_{j}": {
                "type": rng.choice(["string", "integer", "boolean", "array"]),
                "description": " ".join(rng.choice(words) for _ in range(40)),
            }
            for j in range(6)
        }
        tools.append({
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": " ".join(rng.choice(words) for _ in range(200)),
                "parameters": {"type": "object", "properties": props, "required": ["param_0"]},
            },
        })
    return tools


def agent_body(turns: int = 0, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    system = "You are a coding agent.\n" + "Follow the house rules carefully. " * 300
    system += "\nConversation started: Monday, January 5, 2026"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"step {t} {rng.random()}"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{t}", "type": "function",
            "function": {"name": "tool_1", "arguments": json.dumps({"param_0": f"x{t}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": "ok " * 50})
    messages.append({"role": "user", "content": f"Please fix the bug {rng.random()}"})
    return {"model": "m", "messages": messages, "tools": agent_tools()}


def percentiles(samples: list[float]) -> str:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return f"p50 {statistics.median(s) * 1e3:7.2f} ms   p99 {p99 * 1e3:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    cache = TemplateCache()
    for name in TEMPLATES:
        tmpl = ChatTemplate(source=(source_dir() / "models" / "templates" / name).read_text(), cache=cache)
        for label, turns in (("first turn", 0), ("10 turns, fresh", 10)):
            bodies = [agent_body(turns, seed=i) for i in range(args.runs + 5)]
            ident = chat_identity(bodies[0], tmpl, model="m")  # warm the compiled template
            samples = []
            for body in bodies[1:]:
                start = time.perf_counter()
                ident = chat_identity(body, tmpl, model="m")
                samples.append(time.perf_counter() - start)
            print(f"{name:24s} {label:16s} {len(ident.text):6d} chars  {ident.rendered_by:8s} "
                  f"{percentiles(samples)}")
    text = chat_identity(agent_body(), None, model="m").text
    samples = []
    for _ in range(args.runs):
        start = time.perf_counter()
        block_chain(text, seed="m")
        samples.append(time.perf_counter() - start)
    print(f"{'block_chain only':41s} {len(text):6d} chars           {percentiles(samples)}")


if __name__ == "__main__":
    main()
