"""The real client's rows of `bench/later_days.py`: ratios and the markdown table (pure)."""

from __future__ import annotations

import statistics
from typing import Any

from llamafleet_testbed.bench.stats import agreement, share


def ratios(raw: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Plain (same flags) over fleet, per model and row: the figures the README and issue name."""
    out: dict[str, dict[str, float]] = {}
    for model, r in raw["models"].items():
        plain = r["plain_same_flags"]

        def ratio(setup: str, day: str, base: dict[str, Any] = plain, res: dict[str, Any] = r) -> float:
            return round(float(base[day]["ttft_s"]) / max(float(res[setup][day]["ttft_s"]), 1e-6), 2)

        first = first_medians(r)
        out[model] = {
            "first_session_vs_same_flags": round(first["fleet"] / max(first["plain_same_flags"], 1e-6), 2),
            "first_session_fa_on_vs_same_flags": round(first["plain_fa_on"]
                                                       / max(first["plain_same_flags"], 1e-6), 2),
            "day2_pods_restarted": ratio("fleet_pods_restarted", "day2"),
            "day3_pods_restarted": ratio("fleet_pods_restarted", "day3"),
            "day2_whole_restarted": ratio("fleet_whole_restarted", "day2"),
            "day3_whole_restarted": ratio("fleet_whole_restarted", "day3"),
        }
        agreed = fleet_agreement(r)
        if agreed is not None:
            out[model]["agreement"] = round(agreed, 4)
        if "third_session" in r:
            third = r["third_session"]
            out[model]["third_session"] = round(
                third["plain"][2]["ttft_s"] / max(third["fleet"][2]["ttft_s"], 1e-6), 2)
    return out


def fleet_agreement(r: dict[str, Any]) -> float | None:
    """The share of greedy output positions of the fleet's days (both restart kinds) equal to plain's
    with the pods' own flags, the same requests (None: an older run kept no output pieces)."""
    plain = r["plain_same_flags"]
    pairs = [agreement(r[setup][day]["pieces"], plain[day]["pieces"])
             for setup in ("fleet_pods_restarted", "fleet_whole_restarted")
             for day in ("day1", "day2", "day3")
             if "pieces" in r[setup].get(day, {}) and "pieces" in plain[day]]
    return share(pairs) if pairs else None


def first_medians(r: dict[str, Any]) -> dict[str, float]:
    """Median first-session TTFT per setup (the alternated rounds; one day-1 sample in older runs)."""
    if "first_sessions" in r:
        return {k: float(statistics.median(x["ttft_s"] for x in v)) for k, v in r["first_sessions"].items()}
    return {"plain_same_flags": r["plain_same_flags"]["day1"]["ttft_s"],
            "plain_fa_on": r["plain_fa_on"]["day1"]["ttft_s"],
            "fleet": r["fleet_pods_restarted"]["day1"]["ttft_s"]}


ROWS = (  # (label, fleet setup, day): TTFT of plain with the same flags over the fleet's
    ("a day-2 session after day 1, pods restarted", "fleet_pods_restarted", "day2"),
    ("a day-3 session after days 1 and 2, pods restarted", "fleet_pods_restarted", "day3"),
    ("a day-2 session after day 1, whole fleet restarted", "fleet_whole_restarted", "day2"),
    ("a day-3 session after days 1 and 2, whole fleet restarted each day", "fleet_whole_restarted", "day3"),
)


def markdown(raw: dict[str, Any]) -> str:
    """The real client's rows: time to first token, plain and fleet, and their ratio, per model."""
    models = list(raw["models"])
    head = "| Hermes Agent's requests | " + " | ".join(
        f"{m} plain | {m} llamafleet | ratio" for m in models) + " |"
    lines = [head, "|---|" + "---:|---:|---:|" * len(models)]

    def cells(plain: float, fleet: float) -> str:
        return f"{plain:.3f} s | {fleet:.3f} s | {plain / max(fleet, 1e-6):.1f}x"

    runs = list(raw["models"].values())

    def row(label: str, values: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    for label, setup, day in ROWS:
        row(label, [cells(r["plain_same_flags"][day]["ttft_s"], r[setup][day]["ttft_s"]) for r in runs])
    firsts = [first_medians(r) for r in runs]
    row("first session of a never-seen head (plain: the pods' own flags; medians of the rounds)",
        [cells(f["plain_same_flags"], f["fleet"]) for f in firsts])
    row("the same on plain: flash attention on against the pods' off",
        [f"{f['plain_fa_on']:.3f} s (fa on) | {f['plain_same_flags']:.3f} s (fa off) | "
         f"{f['plain_same_flags'] / max(f['plain_fa_on'], 1e-6):.2f}x" for f in firsts])
    if all(fleet_agreement(r) is not None for r in runs):
        row("greedy output positions equal to plain's, the pods' own flags (the six days above)",
            [f" | {fleet_agreement(r):.1%} | " for r in runs])  # the fleet's column of each model
    if all("third_session" in r for r in runs):
        row("3rd concurrent session, same day (plain: flash attention on)",
            [cells(r["third_session"]["plain"][2]["ttft_s"], r["third_session"]["fleet"][2]["ttft_s"])
             for r in runs])
    return "\n".join(lines) + "\n"
