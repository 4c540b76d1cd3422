"""From raw results to the seed table (pure): per model, one row per figure, one column per setup, and
the ratios (a)/(c) and (b)/(c), and (a)/(d) and (b)/(d) with patched pods; then the issues' targets,
each marked reached or missed.

Everything is recomputed from the raw JSON (`summarize(raw)`), so a table can be re-rendered, or a
figure re-checked, without running anything again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamafleet_testbed.bench.setups import FLEETS, LABELS, SETUPS
from llamafleet_testbed.bench.stats import Spread, agreement, fmt_ratio, ratio, restore_figures, share

MIB = 1024 * 1024
COLD_SHARE = 0.05  # a reference reply counts as cold when it reused at most this share of its prompt


def _third(runs: list[list[dict[str, Any]]], session: int = 2) -> Spread:
    return Spread.of(r[session]["ttft_s"] for r in runs if len(r) > session and r[session]["status"] == 200)


def _runs_by_scenario(d: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A setup's replies by scenario run ("as_is/0", "size-24000/0", "later_day", ...)."""
    out = {f"as_is/{i}": run for i, run in enumerate(d.get("as_is", []))}
    out |= {f"declared/{i}": run for i, run in enumerate(d.get("declared", []))}
    out |= {f"size-{s}/{i}": run for s, runs in d.get("sizes", {}).items() for i, run in enumerate(runs)}
    if d.get("later_day"):
        out["later_day"] = d["later_day"]
    return out


def _pairs(ours: dict[str, Any], ref: dict[str, Any]) -> list[tuple[int, int]]:
    """Agreement of every reply of `ours` with the same request's reply in `ref`, where `ref` computed
    the whole prompt (a cold run). Runs pair by scenario: a cold reference may leave some out."""
    mine, theirs = _runs_by_scenario(ours), _runs_by_scenario(ref)
    pairs = []
    for key in sorted(mine.keys() & theirs.keys()):
        for a, b in zip(mine[key], theirs[key], strict=False):
            prompt = b["cache_n"] + b["prompt_n"]
            if b["status"] == 200 and a["status"] == 200 and prompt and b["cache_n"] <= COLD_SHARE * prompt:
                pairs.append(agreement(a["pieces"], b["pieces"]))
    return pairs


def _ok(replies: list[dict[str, Any]], i: int, key: str) -> list[float]:
    return [replies[i][key]] if len(replies) > i and replies[i]["status"] == 200 else []


def _three_at_once(d: dict[str, Any], kv_per_token: int) -> dict[str, Any]:
    """KV memory per session (what the servers said they hold, `scenarios.kv_cells`) against the
    sessions' history (the tokens their prompts add to the history-less ones'), and the decode speed of
    three sessions at once with no history."""
    points: list[tuple[int, float, float]] = []  # (turns, mean prompt tokens, MiB per session)
    decode: list[float] = []
    for run in d.get("kv_by_history", []):
        done = [r for r in run["replies"] if r["status"] == 200]
        if len(done) != 3 or not run.get("cells"):
            continue
        points.append((run["history_turns"], sum(r["cache_n"] + r["prompt_n"] for r in done) / 3,
                       run["cells"] * kv_per_token / 3 / MIB))
        if run["history_turns"] == 0:
            decode = [r["decode_tps"] for r in done]
    base = next((tokens for turns, tokens, _ in points if turns == 0), None)
    return {
        "kv_three_mib": Spread.of([mib for turns, _, mib in points if turns == 0]),
        "kv_by_history": [(tokens - base, mib) for _, tokens, mib in points] if base is not None else [],
        "decode_three_tps": Spread.of(decode),
    }


def summarize_setup(d: dict[str, Any], ref: dict[str, Any] | None, minimum: int, kv_per_token: int,
                    sizes: list[int]) -> dict[str, Any]:
    day, ram_day = d.get("later_day", []), d.get("later_day_ram", [])
    third = d.get("as_is", [])
    by_size = {sizes[0]: _third(third)}
    by_size |= {int(s): _third(runs) for s, runs in d.get("sizes", {}).items()}
    # The 1st session of each size computed its prefix everywhere: how a cold prefill grows with size.
    first_by_size = {sizes[0]: _third(third, 0)}
    first_by_size |= {int(s): _third(runs, 0) for s, runs in d.get("sizes", {}).items()}
    held = [r[2]["cache_n"] + r[2]["prompt_n"] + len(r[2]["pieces"]) for r in third if len(r) > 2]
    reused = [r[2]["cache_n"] / max(1, r[2]["cache_n"] + r[2]["prompt_n"]) for r in third if len(r) > 2]
    mixed = d.get("mixed", {})
    pairs = _pairs(d, ref) if ref is not None else []
    return {
        "third_as_is": _third(third),
        "third_declared": _third(d.get("declared", [])),
        "day_first": Spread.of([day[1]["ttft_s"]] if len(day) > 1 else []),
        "day_next": Spread.of([day[2]["ttft_s"]] if len(day) > 2 else []),
        "ram_day_first": Spread.of(_ok(ram_day, 1, "ttft_s")),
        "ram_day_next": Spread.of(_ok(ram_day, 2, "ttft_s")),
        **_three_at_once(d, kv_per_token),
        "by_size": by_size,
        "growth": ratio(by_size[sizes[-1]].median, by_size[sizes[0]].median),
        "first_by_size": first_by_size,
        "growth_first": ratio(first_by_size[sizes[-1]].median, first_by_size[sizes[0]].median),
        "reused_share": Spread.of(reused),
        "computed": float(mixed.get("computed", float("nan"))),
        "computed_x_min": ratio(float(mixed.get("computed", float("nan"))), float(minimum)),
        "mixed_failed": int(mixed.get("failed", 0)),
        "kv_session_mib": Spread.of(h * kv_per_token / MIB for h in held),
        "snapshot_mib": d.get("snapshot_bytes", 0) / MIB,
        "decode_tps": Spread.of([day[2]["decode_tps"]] if len(day) > 2 else []),
        "agreement": share(pairs) if ref is not None else 1.0,
        "agreement_positions": sum(t for _, t in pairs),
        "restores": restore_figures(d.get("restores", []), d.get("snapshot_files", []), sizes[0]),
    }


def summarize(raw: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> setup -> figures (Spread objects for repeated timings)."""
    sizes = [int(s) for s in raw["plan"]["sizes"]]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for model, res in raw["models"].items():
        setups = res["setups"]
        plain = setups.get("plain")
        # The fleet's outputs compare with a cold run of its own command line when (a) runs other
        # flags (run.cold_reference); the baselines' with (a).
        refs = {kind: None if kind == "plain" else plain for kind in setups}
        for fleet in FLEETS:
            if res.get("reference") is not None and fleet in refs:
                refs[fleet] = res["reference"]
        out[model] = {
            kind: summarize_setup(d, refs[kind], int(res.get("minimum_prefill", 0)),
                                  int(res["kv"]["bytes_per_token"]), sizes)
            for kind, d in setups.items()}
    return out


Row = tuple[str, Callable[[dict[str, Any]], str], Callable[[dict[str, Any]], float] | None]


def _rows(sizes: list[int]) -> list[Row]:
    def t(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda s: s[key].fmt()

    def m(key: str) -> Callable[[dict[str, Any]], float]:
        return lambda s: float(s[key].median)

    rows: list[Row] = [
        ("3rd concurrent session TTFT, prompts as they are", t("third_as_is"), m("third_as_is")),
        ("3rd concurrent session TTFT, one SharedPrefix declared (a, b: warm-up request)",
         t("third_declared"), m("third_declared")),
        ("later day (every pod restarted): first session TTFT", t("day_first"), m("day_first")),
        ("later day: next session TTFT", t("day_next"), m("day_next")),
        ("later day from RAM (no restart, every slot taken in between): first session TTFT",
         t("ram_day_first"), m("ram_day_first")),
        ("later day from RAM: next session TTFT", t("ram_day_next"), m("ram_day_next")),
    ]
    def at(size: int) -> Row:
        def text(s: dict[str, Any]) -> str:
            return str(s["by_size"][size].fmt())

        def value(s: dict[str, Any]) -> float:
            return float(s["by_size"][size].median)
        return (f"3rd session TTFT, {size // 1000}K-token prefix", text, value)

    rows += [at(size) for size in sizes]
    rows += [
        (f"3rd session TTFT growth {sizes[-1] // 1000}K / {sizes[0] // 1000}K",
         lambda s: fmt_ratio(s["growth"]), None),
        (f"1st session (computes the prefix) TTFT growth {sizes[-1] // 1000}K / {sizes[0] // 1000}K",
         lambda s: fmt_ratio(s["growth_first"]), None),
        ("3rd session: share of the prompt reused", lambda s: f"{s['reused_share'].median:.1%}", None),
        ("prefill tokens computed, 50-session mixed workload (x minimum)",
         lambda s: f"{s['computed']:.0f} ({fmt_ratio(s['computed_x_min'])})", lambda s: float(s["computed"])),
        ("KV held in slots per session (MiB, from token counts)", lambda s: s["kv_session_mib"].fmt("", 2),
         None),
        ("KV memory per session, 3 sessions at once, no history (MiB, the servers' own count)",
         lambda s: s["kv_three_mib"].fmt("", 2), m("kv_three_mib")),
        ("snapshot files on disk at the end (MiB)", lambda s: f"{s['snapshot_mib']:.1f}", None),
        (f"one {sizes[0] // 1000}K-token snapshot file (MiB)", lambda s: s["restores"]["mib"].fmt("", 2),
         None),
        ("restoring it: llama-server's load (ms)", lambda s: s["restores"]["server_ms"].fmt("", 1), None),
        ("restoring it: the gateway's whole restore, agent's checks included (ms)",
         lambda s: s["restores"]["gateway_ms"].fmt("", 1), None),
        ("decode tokens/s (one session)", lambda s: s["decode_tps"].fmt("", 0), None),
        ("decode tokens/s per session, 3 sessions at once", lambda s: s["decode_three_tps"].fmt("", 0), None),
        ("greedy output positions equal to a cold run (a; for (c), its own server flags when they differ)",
         lambda s: f"{s['agreement']:.1%} of {s['agreement_positions']}" if s["agreement_positions"]
         else "(reference)", None),
    ]
    return rows


def markdown(raw: dict[str, Any], summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    sizes = [int(s) for s in raw["plan"]["sizes"]]
    lines: list[str] = []
    for model, setups in summary.items():
        kinds = [k for k in SETUPS if k in setups]
        ours = [(k, LABELS[k].split(" ", 1)[0]) for k in FLEETS if k in setups]  # (c), (d)
        heads = [f"{base} / {tag}" for _, tag in ours for base in ("(a)", "(b)")]
        lines += [f"### {model}", "", "| | " + " | ".join(LABELS[k] for k in kinds)
                  + "".join(f" | {h}" for h in heads) + " |", "|---|" + "---:|" * (len(kinds) + len(heads))]
        for label, text, value in _rows(sizes):
            cells = [text(setups[k]) for k in kinds]
            ratios = [""] * len(heads)
            if value is not None:
                ratios = [fmt_ratio(ratio(value(setups[k]), value(setups[fleet]))) if k in setups else "n/a"
                          for fleet, _ in ours for k in ("plain", "sglang")]
            lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    return "\n".join(lines)


def targets(raw: dict[str, Any], summary: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's figures to reach, one entry per model and figure: value, goal, reached."""
    sizes = [int(s) for s in raw["plan"]["sizes"]]
    growth = f"TTFT {sizes[-1] // 1000}K / {sizes[0] // 1000}K"
    out: list[dict[str, Any]] = []
    for model, s in summary.items():
        c, a, b = s.get("llamafleet"), s.get("plain"), s.get("sglang")
        if c is None or a is None:
            continue
        items: list[tuple[str, float, str, bool]] = []
        goals = (("third_as_is", "3rd session TTFT", 12.0), ("day_first", "later day TTFT", 10.0))
        for key, name, goal in goals:
            for other, tag in ((a, "(a)"), (b, "(b)")):
                if other is not None:
                    r = ratio(other[key].median, c[key].median)
                    items.append((f"{name}: {tag}/(c)", r, f">= {goal:.0f}x", r >= goal))
        items += [
            (f"llamafleet {growth}", c["growth"], "<= 1.2x", c["growth"] <= 1.2),
            (f"(a) 3rd session {growth}", a["growth"], "> 4x", a["growth"] > 4.0),
            (f"(a) 1st session (cold) {growth}", a["growth_first"], "> 4x", a["growth_first"] > 4.0),
            ("prefill tokens / minimum", c["computed_x_min"], "<= 1.1x", c["computed_x_min"] <= 1.1),
            ("greedy agreement with a cold run", c["agreement"], ">= 99%", c["agreement"] >= 0.99),
        ]
        d = s.get("patched")
        if d is not None:  # issue 21's figures for (d)
            for other, tag in ((a, "(a)"), (b, "(b)")):
                if other is not None:
                    r = ratio(other["third_as_is"].median, d["third_as_is"].median)
                    items.append((f"3rd session TTFT: {tag}/(d)", r, ">= 30x", r >= 30.0))
            r = ratio(a["day_first"].median, d["day_first"].median)
            ram = ratio(a["ram_day_first"].median, d["ram_day_first"].median)
            kv = ratio(d["kv_three_mib"].median, c["kv_three_mib"].median)
            decode = ratio(d["decode_three_tps"].median, c["decode_three_tps"].median)
            items += [
                ("later day from RAM: (a)/(d)", ram, ">= 20x", ram >= 20.0),
                ("later day after a restart, from disk: (a)/(d)", r, ">= 10x", r >= 10.0),
                ("KV memory per session, 3 sessions: (d)/(c)", kv, "<= 0.45x (55% lower)", kv <= 0.45),
                ("decode tokens/s, 3 sessions: (d)/(c)", decode, ">= 1.1x", decode >= 1.1),
                ("(d) prefill tokens / minimum", d["computed_x_min"], "<= 1.05x",
                 d["computed_x_min"] <= 1.05),
                ("(d) greedy agreement with a cold run", d["agreement"], ">= 99%", d["agreement"] >= 0.99),
            ]
        out += [{"model": model, "figure": n, "value": v, "goal": g, "reached": bool(ok)}
                for n, v, g, ok in items]
    return out


def targets_markdown(items: list[dict[str, Any]]) -> str:
    lines = ["| model | figure | value | goal | reached |", "|---|---|---:|---|---|"]
    for t in items:
        value = f"{t['value']:.1%}" if "agreement" in t["figure"] else fmt_ratio(t["value"])
        lines.append(f"| {t['model']} | {t['figure']} | {value} | {t['goal']} | "
                     f"{'yes' if t['reached'] else '**no**'} |")
    return "\n".join(lines)


def to_json(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The summary with Spreads as dicts (for the result file)."""
    def conv(v: Any) -> Any:
        if isinstance(v, Spread):
            return v.as_dict()
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v
    return {m: {k: conv(d) for k, d in setups.items()} for m, setups in summary.items()}
