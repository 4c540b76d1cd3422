"""PNG plots of a seed-table run: TTFT of the 3rd session against prefix size for the setups, prefill
tokens computed over the mixed workload against the perfect-cache minimum, and KV memory per session
against the sessions' history (three sessions at once, the servers' own cell counts). matplotlib is
imported here only (the `bench` extra), with the non-interactive backend: no display is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llamafleet_testbed.bench.setups import LABELS, SETUPS


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_by_size(summary: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    plt = _pyplot()
    models = list(summary)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for kind in SETUPS:
            s = summary[model].get(kind)
            if s is None:
                continue
            sizes = sorted(s["by_size"])
            med = [s["by_size"][k].median for k in sizes]
            low = [m - s["by_size"][k].low for k, m in zip(sizes, med, strict=True)]
            high = [s["by_size"][k].high - m for k, m in zip(sizes, med, strict=True)]
            ax.errorbar([k / 1000 for k in sizes], med, yerr=[low, high], marker="o", capsize=3,
                        label=LABELS[kind])
        ax.set_yscale("log")
        ax.set_xlabel("shared prefix (K tokens)")
        ax.set_ylabel("TTFT of the 3rd concurrent session (s)")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kv_by_history(summary: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    plt = _pyplot()
    models = list(summary)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        drawn = 0
        for kind in SETUPS:
            points = sorted((summary[model].get(kind) or {}).get("kv_by_history") or [])
            if points:
                drawn += 1
                ax.plot([t / 1000 for t, _ in points], [mib for _, mib in points], marker="o",
                        label=LABELS[kind])
        ax.set_xlabel("history per session (K tokens, beyond the shared head)")
        ax.set_ylabel("KV memory per session (MiB), 3 sessions")
        ax.set_ylim(bottom=0)
        ax.set_title(model if drawn else f"{model} (not measured in this run)")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tokens_computed(summary: dict[str, dict[str, dict[str, Any]]], minimum: dict[str, int],
                    path: Path) -> Path:
    plt = _pyplot()
    models = list(summary)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / (len(SETUPS) + 1)
    for i, kind in enumerate(SETUPS):
        values = [summary[m].get(kind, {}).get("computed", 0) / 1000 for m in models]
        ax.bar([j + i * width for j in range(len(models))], values, width, label=LABELS[kind])
    ax.bar([j + len(SETUPS) * width for j in range(len(models))], [minimum.get(m, 0) / 1000 for m in models],
           width, label="minimum (perfect cache)", color="grey")
    ax.set_xticks([j + width * len(SETUPS) / 2 for j in range(len(models))], models)
    ax.set_ylabel("prefill tokens computed (K), 50 sessions")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def session_ttfts(rows: list[tuple[str, str, float]], path: Path, title: str) -> Path:
    """The demo's plot: one bar per (setup, session) TTFT, log scale."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    setups = list(dict.fromkeys(r[0] for r in rows))
    sessions = list(dict.fromkeys(r[1] for r in rows))
    width = 0.8 / max(1, len(setups))
    for i, setup in enumerate(setups):
        vals = {s: t for su, s, t in rows if su == setup}
        ax.bar([j + i * width for j in range(len(sessions))], [vals.get(s, 0.0) for s in sessions], width,
               label=setup)
    ax.set_xticks([j + width * (len(setups) - 1) / 2 for j in range(len(sessions))], sessions)
    ax.set_yscale("log")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
