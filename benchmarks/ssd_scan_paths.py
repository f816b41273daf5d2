"""The Mamba2 prefill scan with internal checkpoints, three ways, side by side in one process
(order shuffled every round, CPU time of this thread, torch on one thread), at `tiny`'s Mamba
shapes (8 heads x 64, 2 groups, d_state 64, Q = 64):

    one scan      the whole chunk in one piece, no state asked for inside (what a chunk that
                  writes no internal checkpoint cost before `SCAN_PIECE_CHUNKS`)
    cut           the scan ended at every checkpoint and restarted there (the mixer's old
                  write path: a call and a padded chunk per checkpoint)
    pieces        `ssd_chunked_states` asked for no state inside: pieces of
                  `SCAN_PIECE_CHUNKS` chunks (a chunk that writes no internal checkpoint now)
    pieces+at     the same, the checkpoint states read out of the scan (the mixer's path now)

    .venv/bin/python benchmarks/ssd_scan_paths.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

import hycache.model.ssd as ssd

H, P, G, N, Q = 8, 64, 2, 64, 64

# (tokens, checkpoint offsets): about a 1,024-token prompt's chunk under `limit` (the block
# boundary 552 and two near the end), the families row's 4,064-token chunk with 7 block
# boundaries, and a whole 8,192-token step
CASES: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1_055, (552, 1_016, 1_048)),
    (4_064, tuple(107 + 552 * i for i in range(7))),
    (8_192, tuple(552 * i for i in range(1, 15))),
)


def compare(
    t: int, offsets: tuple[int, ...], rounds: int, gen: torch.Generator, rng: random.Random
) -> dict[str, float]:
    """Median CPU seconds of each way over `rounds` shuffled rounds."""
    s0 = torch.randn(1, H, P, N, generator=gen)
    x = torch.randn(1, t, H, P, generator=gen)
    dt = torch.rand(1, t, H, generator=gen) * 0.1
    A = -torch.rand(H, generator=gen)
    B = torch.randn(1, t, G, N, generator=gen)
    C = torch.randn(1, t, G, N, generator=gen)

    def one() -> None:
        ssd._scan(x, dt, A, B, C, Q, s0, ())

    def cut() -> None:
        y = torch.empty_like(x)  # the mixer wrote each segment's y into the step's
        prev, state = 0, s0
        for off in (*offsets, t):
            seg = slice(prev, off)
            y_seg, state, _ = ssd._scan(
                x[:, seg], dt[:, seg], A, B[:, seg], C[:, seg], Q, state, ()
            )
            y[:, seg] = y_seg
            prev = off

    def pieces() -> None:
        ssd.ssd_chunked_states(x, dt, A, B, C, Q, s0)

    def pieces_at() -> None:
        ssd.ssd_chunked_states(x, dt, A, B, C, Q, s0, offsets)

    arms: dict[str, Callable[[], None]] = {
        "one scan": one,
        "cut": cut,
        "pieces": pieces,
        "pieces+at": pieces_at,
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    order = list(arms)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            c = time.thread_time()
            arms[k]()
            times[k].append(time.thread_time() - c)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for t, offsets in CASES:
        med = compare(t, offsets, args.rounds, gen, rng)
        print(
            f"{t:6,d} tokens, {len(offsets):2d} checkpoints: "
            + "  ".join(f"{k} {v * 1e3:6.1f} ms" for k, v in med.items())
            + f"  | one scan / pieces {med['one scan'] / med['pieces']:.2f}x,"
            f" cut / pieces+at {med['cut'] / med['pieces+at']:.2f}x,"
            f" pieces+at / pieces {med['pieces+at'] / med['pieces']:.2f}x"
        )


if __name__ == "__main__":
    main()
