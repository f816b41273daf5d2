"""docs/img/resume-points.png: where a producer keeps SSM checkpoints and where its siblings
resume, per policy, from `hycache explain --json` on the worked shape (B = 4,416, u = 64,
EAGLE, a 57,600-token shared prompt + 6,416). Run from the repository root:

    .venv/bin/python docs/img/resume_points.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).with_name("resume-points.png")
SHAPE = ["--block-size", "4416", "--prefix-match-unit", "64", "--eagle",
         "--prompt-tokens", "64016", "--shared-prefix", "57600"]  # fmt: skip
LO, HI = 50_000, 64_800


def explain() -> dict:
    cmd = [sys.executable, "-m", "hycache.cli.main", "explain", *SHAPE, "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    doc = explain()
    block, shared = doc["inputs"]["block_size"], doc["inputs"]["shared_prefix"]
    policies = list(doc["policies"])
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    for b in range(0, HI + 1, block):
        if b >= LO:
            ax.axvline(b, color="0.85", lw=1, zorder=0)
    ax.axvline(shared, color="tab:green", lw=1.5, ls="--", label=f"shared prefix P = {shared:,}")
    for y, name in enumerate(reversed(policies)):
        p = doc["policies"][name]
        ax.axhline(y, color="0.9", lw=0.8, zorder=0)
        keep = [c for c in p["producer_checkpoints"] if c >= LO]
        ax.scatter(keep, [y] * len(keep), marker="|", s=260, color="tab:blue", zorder=2,
                   label="producer's SSM checkpoints" if y == 0 else None)  # fmt: skip
        best = max(p["siblings"])
        ax.scatter([best], [y], marker="o", s=70, color="tab:red", zorder=3,
                   label="where the later siblings resume" if y == 0 else None)  # fmt: skip
        ax.annotate(f"{best:,}", (best, y), xytext=(-6, 8), textcoords="offset points",
                    ha="right", fontsize=8, color="tab:red")  # fmt: skip
    limit = doc["policies"][policies[0]]["limit"]
    ax.axvline(limit, color="tab:red", lw=1, ls=":", label=f"the limit {limit:,}")
    ax.set_yticks(range(len(policies)), list(reversed(policies)))
    ax.set_xlim(LO, HI)
    ax.set_ylim(-0.6, len(policies) - 0.2)
    ax.set_xlabel(f"token position (grey: the block grid, B = {block:,})")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, fontsize=8, frameon=False)
    ax.set_title("A sibling sharing 57,600 tokens: where it resumes, per policy", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, metadata={"Software": None})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
