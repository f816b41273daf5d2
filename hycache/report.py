"""Terminal tables (rich), atomic JSON/JSONL writing and plots for the command line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=False)
if not console.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
    console = Console(stderr=False, width=120)
err_console = Console(stderr=True)


def progress_bar(disable: bool = False) -> Progress:
    """The command line's progress bar on stderr: description, bar, done / total, elapsed."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=disable,
    )


@contextlib.contextmanager
def progress_reporter(what: str) -> Iterator[Callable[[str], None]]:
    """A callback that reports progress on stderr: a live status line on a terminal, plain
    timestamped lines otherwise (a piped or logged run is never silent)."""
    if err_console.is_terminal:
        with err_console.status(what) as status:
            yield lambda msg: status.update(f"{what}: {msg}")
        return
    start = time.monotonic()

    def line(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {what}: {msg}", file=sys.stderr, flush=True)

    yield line


def check_writable(path: str | Path | None, flag: str) -> None:
    """Fail now, with `flag` in the message, when `path` could not be written later (checked
    before a long run, never after it): its folder is missing and cannot be made, is a file,
    or is read-only; or the path is a folder."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a folder; give a file path")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag}: cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot write {path}: {parent} is not writable")


def write_atomic(path: str | Path, text: str) -> None:
    """Write the whole file or nothing: a failure leaves no partial output behind. The file
    gets the usual permissions (0666 less the umask), not the temporary file's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
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
        ("SSM pages keyed: at the end / peak", "ssm_pages_held"),
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
    ("requests that observed a junction", "junctions_observed", False),
    ("extra prefill steps (max)", "extra_prefill_steps_max", False),
    ("SSM state pages keyed (total)", "ssm_pages_stored", True),
    ("  of which decode snapshots", "ssm_snapshot_pages", False),
    ("SSM state pages keyed (peak held)", "ssm_pages_peak", True),
    ("peak blocks used", "peak_blocks_used", False),
    ("cache blocks", "num_blocks", False),
    ("preemptions", "preemptions", False),
)


def _ratio(v: Any, base: Any) -> str:
    ok = isinstance(v, int | float) and isinstance(base, int | float) and base
    return f"{v / base:.3f}x" if ok else ""


def headline_pair(names: list[str]) -> tuple[str, str] | None:
    """(numerator, denominator) of a table's ratio column: `limit / lookahead` when both are
    there, the second arm over the first for a pair, else None."""
    from hycache.sim.compare import BASELINE, HEADLINE

    if HEADLINE in names and BASELINE in names:
        return HEADLINE, BASELINE
    if len(names) == 2:
        return names[1], names[0]
    return None


def policy_table(title: str, policies: Mapping[str, Mapping[str, Any]]) -> Table:
    """Metrics per arm; a bold column with the headline ratio (`limit / lookahead`), and a last
    row with every arm's output tokens/s over the baseline (`lookahead` when present)."""
    from hycache.sim.compare import reference_arm

    table = Table(title=title)
    table.add_column("metric")
    names = list(policies)
    for name in names:
        table.add_column(name, justify="right")
    pair = headline_pair(names)
    if pair:
        table.add_column(f"{pair[0]}/{pair[1]}", justify="right", style="bold")
    for label, key, ratio in SIM_ROWS:
        if all(policies[n].get(key) is None for n in names):
            continue
        cells = [fmt(policies[n].get(key)) for n in names]
        if pair:
            num, den = (policies[x].get(key) for x in pair)
            cells.append(_ratio(num, den) if ratio else "")
        table.add_row(label, *cells)
    if len(names) > 1:
        base = reference_arm(names)
        key = "output_tokens_per_s"
        cells = [_ratio(policies[n].get(key), policies[base].get(key)) for n in names]
        table.add_row(f"output tokens/s ÷ {base}", *cells, *([""] if pair else []), style="bold")
    return table


def curves_table(curves: Mapping[str, Any]) -> Table:
    """`limit / lookahead` output tokens/s at each point of the bench's curves."""
    from hycache.sim.compare import BASELINE, HEADLINE

    table = Table(title=f"{HEADLINE} / {BASELINE} output tokens/s (simulated curves)")
    table.add_column("over")
    table.add_column("workload")
    table.add_column("x: ratio")
    for axis in ("output_tokens", "concurrency"):
        for name, points in curves.get(axis, {}).items():
            cells = "  ".join(f"{p['x']}: {p['ratio']:.3f}" for p in points)
            table.add_row(axis.replace("_", " "), name, cells)
    return table


def _savefig(fig: Any, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_policies(path: str | Path, title: str, policies: Mapping[str, Mapping[str, Any]]) -> None:
    """Throughput and TTFT per arm, side by side (PNG); throughput bars carry their ratio to
    the baseline (`lookahead` when present)."""
    from hycache.sim.compare import reference_arm

    plt = _pyplot()
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

    plt = _pyplot()
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
