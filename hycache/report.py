"""Terminal tables (rich), atomic JSON/JSONL writing and plots for the command line."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(stderr=False)
if not console.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
    console = Console(stderr=False, width=120)
err_console = Console(stderr=True)


def write_atomic(path: str | Path, text: str) -> None:
    """Write the whole file or nothing: a failure leaves no partial output behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    if isinstance(v, list):
        return " / ".join(fmt(x) for x in v)
    return str(v)


def explain_table(result: Mapping[str, Any]) -> Table:
    inp = result["inputs"]
    title = (
        f"B={inp['block_size']:,}  u={inp['prefix_match_unit']:,}  "
        f"EAGLE {'on' if inp['eagle'] else 'off'}  T={inp['prompt_tokens']:,}  "
        f"P={inp['shared_prefix']:,}"
    )
    policies = result["policies"]
    table = Table(title=title)
    table.add_column("position")
    for name in policies:
        table.add_column(name, justify="right")
    rows = [
        ("replay boundary", "replay_boundary"),
        ("tail checkpoint", "tail_checkpoint"),
        ("producer checkpoints (observed)", "producer_checkpoints"),
        ("identical resend resumes at", "resend"),
        ("sibling 1 / 2 / 3 resume at", "siblings"),
        ("sibling junctions observed", "sibling_junctions"),
        ("sibling prefill steps", "sibling_prefill_steps"),
        ("the limit floor((P-1)/u)*u", "limit"),
    ]
    for label, key in rows:
        table.add_row(label, *(fmt(p[key]) for p in policies.values()))
    return table


SIM_ROWS = (
    ("output tokens/s", "output_tokens_per_s", True),
    ("requests/s", "request_throughput", True),
    ("TTFT p50 (s)", "ttft_p50_s", True),
    ("TTFT p95 (s)", "ttft_p95_s", True),
    ("ITL p50 (s)", "itl_p50_s", True),
    ("ITL p95 (s)", "itl_p95_s", True),
    ("prefill tokens computed", "prefill_tokens_computed", True),
    ("hit tokens", "hit_tokens", True),
    ("token hit rate", "token_hit_rate", True),
    ("lost-reuse tokens", "lost_reuse_tokens", False),
    ("extra prefill steps (max)", "extra_prefill_steps_max", False),
    ("peak blocks used", "peak_blocks_used", False),
    ("preemptions", "preemptions", False),
)


def policy_table(title: str, policies: Mapping[str, Mapping[str, Any]]) -> Table:
    """Metrics per policy, with each value's ratio to the first policy."""
    table = Table(title=title)
    table.add_column("metric")
    names = list(policies)
    for i, name in enumerate(names):
        table.add_column(name, justify="right")
        if i:
            table.add_column(f"{name}/{names[0]}", justify="right", style="bold")
    for label, key, ratio in SIM_ROWS:
        base = policies[names[0]].get(key)
        cells = []
        for i, name in enumerate(names):
            v = policies[name].get(key)
            cells.append(fmt(v))
            if i:
                ok = ratio and isinstance(v, int | float) and isinstance(base, int | float) and base
                cells.append(f"{v / base:.3f}x" if ok else "")
        table.add_row(label, *cells)
    return table


def plot_policies(path: str | Path, title: str, policies: Mapping[str, Mapping[str, Any]]) -> None:
    """Throughput and TTFT per policy, side by side (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(policies)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax1.bar(names, [policies[n]["output_tokens_per_s"] for n in names], color="tab:blue")
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("throughput")
    x = range(len(names))
    ax2.bar([i - 0.2 for i in x], [policies[n]["ttft_p50_s"] for n in names], 0.4, label="p50")
    ax2.bar([i + 0.2 for i in x], [policies[n]["ttft_p95_s"] for n in names], 0.4, label="p95")
    ax2.set_xticks(list(x), names)
    ax2.set_ylabel("seconds")
    ax2.set_title("time to first token")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bench(path: str | Path, doc: Mapping[str, Any]) -> None:
    """One panel per comparison: output tokens/s and TTFT p50 relative to `replay`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Mapping[str, Any]]] = []
    if "engine" in doc:
        panels.append(("CPU engine (tiny)", doc["engine"]["policies"]))
    for name, part in doc.get("simulated", {}).items():
        panels.append((f"simulated: {name}", part["policies"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.4), squeeze=False)
    for ax, (title, pol) in zip(axes[0], panels, strict=True):
        names = list(pol)
        base = pol.get("replay", pol[names[0]])
        x = range(len(names))
        tput = [pol[n]["output_tokens_per_s"] / base["output_tokens_per_s"] for n in names]
        ttft = [
            pol[n]["ttft_p50_s"] / base["ttft_p50_s"] if base["ttft_p50_s"] else 1.0 for n in names
        ]
        ax.bar([i - 0.2 for i in x], tput, 0.4, label="output tok/s")
        ax.bar([i + 0.2 for i in x], ttft, 0.4, label="TTFT p50")
        for i, v in enumerate(tput):
            ax.text(i - 0.2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(list(x), names)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("relative to replay")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
