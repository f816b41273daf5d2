"""The benchmarks' and `hycache simulate --plot`'s figures (matplotlib, PNG): throughput and
TTFT per arm, the bench's panels and `limit / lookahead` curves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _savefig(fig: Any, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_policies(path: str | Path, title: str, policies: Mapping[str, Mapping[str, Any]]) -> None:
    """Throughput and TTFT per arm, side by side (PNG); throughput bars carry their ratio to
    the baseline (`lookahead` when present)."""
    from hycache.sim.compare import reference_arm

    plt = pyplot()
    names = list(policies)
    base = policies[reference_arm(names)]["output_tokens_per_s"] or 1.0
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    tput = [policies[n]["output_tokens_per_s"] for n in names]
    ax1.bar(names, tput, color="tab:blue")
    for i, v in enumerate(tput):
        ax1.text(i, v, f"{v / base:.2f}x", ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("output tokens/s")
    ax1.set_title(f"throughput (labels: ÷ {reference_arm(names)})")
    ax1.tick_params(axis="x", labelsize=8)
    x = range(len(names))
    ax2.bar([i - 0.2 for i in x], [policies[n]["ttft_p50_s"] for n in names], 0.4, label="p50")
    ax2.bar([i + 0.2 for i in x], [policies[n]["ttft_p95_s"] for n in names], 0.4, label="p95")
    ax2.set_xticks(list(x), names, fontsize=8)
    ax2.set_ylabel("seconds")
    ax2.set_title("time to first token")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    _savefig(fig, path)


def _bench_panels(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    panels: list[tuple[str, Mapping[str, Any]]] = []
    if "engine" in doc:
        panels.append(("CPU engine (tiny), median", doc["engine"]["policies"]))
    for name, part in doc.get("simulated", {}).items():
        panels.append((f"simulated: {name}", part["policies"]))
    return panels


def plot_bench(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Top row, one panel per table: each arm's output tokens/s and TTFT p50 over the baseline
    (`lookahead`). Bottom row: `limit / lookahead` output tokens/s over output length and over
    concurrency (system-prompt and family), when the document has curves."""
    from hycache.sim.compare import BASELINE, HEADLINE, reference_arm

    plt = pyplot()
    panels = _bench_panels(doc)
    curves = doc.get("curves")
    cols = max(len(panels), 2)
    rows = 2 if curves else 1
    fig = plt.figure(figsize=(3.3 * cols, 3.6 * rows))
    grid = fig.add_gridspec(rows, cols * 2)
    for k, (title, pol) in enumerate(panels):
        ax = fig.add_subplot(grid[0, 2 * k : 2 * k + 2])
        names = list(pol)
        base = pol[reference_arm(names)]
        x = range(len(names))
        tput = [pol[n]["output_tokens_per_s"] / base["output_tokens_per_s"] for n in names]
        ttft = [
            pol[n]["ttft_p50_s"] / base["ttft_p50_s"] if base["ttft_p50_s"] else 1.0 for n in names
        ]
        ax.bar([i - 0.2 for i in x], tput, 0.4, label="output tok/s")
        ax.bar([i + 0.2 for i in x], ttft, 0.4, label="TTFT p50")
        for i, v in enumerate(tput):
            ax.text(i - 0.2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        if k == 0:
            ax.set_ylabel(f"relative to {reference_arm(names)}")
            ax.legend(fontsize=7)
    if curves:
        for k, (axis, label) in enumerate(
            (("output_tokens", "output tokens per request"), ("concurrency", "concurrency"))
        ):
            half = cols
            ax = fig.add_subplot(grid[1, k * half : (k + 1) * half])
            for name, points in curves[axis].items():
                xs = [p["x"] for p in points]
                ys = [p["ratio"] for p in points]
                ax.plot(xs, ys, marker="o", label=name)
                for xv, yv in zip(xs, ys, strict=True):
                    ax.annotate(
                        f"{yv:.2f}",
                        (xv, yv),
                        fontsize=6,
                        xytext=(0, 4),
                        textcoords="offset points",
                        ha="center",
                    )
            ax.set_xscale("log", base=2)
            ticks = sorted({p["x"] for pts in curves[axis].values() for p in pts})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.set_xlabel(label)
            ax.set_ylabel(f"{HEADLINE} / {BASELINE} output tok/s")
            ax.set_title(f"{HEADLINE} / {BASELINE} over {label}", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    _savefig(fig, path)
