"""One bench, run on two checkouts in turn, its figures side by side with the ratio (docs/performance.md).

    python bench/before_after.py --before /tmp/before [--runs 3] -- bench/placement.py --nodes 5000 ...

Each run alternates the two trees (before, after, before, after, ...), so both meet the same machine; each tree
runs its own code (PYTHONPATH at its `operator/`) and its own copy of the bench. A figure is a row the bench prints
with a label and a number: `p50 <ms>` for latency rows, else the first number after the label. Rows only one side
prints (a case the older bench lacks) are listed with a dash. Per row: the median over the runs of each side, and
after/before.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
LATENCY = re.compile(r"^(?P<label>.+?)\s+p50\s+(?P<value>[\d.]+)\s*ms")
FIGURE = re.compile(r"^(?P<label>[A-Za-z].*?)\s{2,}(?P<value>\d[\d.]*)")


def figures(text: str) -> dict[str, float]:
    """The bench's rows as label -> number; a label printed twice gets its place appended."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        found = LATENCY.match(line) or FIGURE.match(line)
        if found is None:
            continue
        label = found["label"].strip()
        if label in out:
            label = f"{label} ({sum(k.startswith(label) for k in out) + 1})"
        out[label] = float(found["value"])
    return out


def run(tree: Path, bench: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'operator'}{os.pathsep}{tree}"}
    done = subprocess.run([sys.executable, *bench], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(bench)} failed in {tree}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return figures(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout (a git worktree)")
    parser.add_argument("--after", type=Path, default=HERE, help="the newer checkout (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- the bench and its arguments")
    args = parser.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.runs):
        sides["before"].append(run(args.before, bench))
        sides["after"].append(run(args.after, bench))
    labels = list(dict.fromkeys(k for side in ("before", "after") for r in sides[side] for k in r))
    if not labels:
        raise SystemExit(f"{' '.join(bench)} printed no figure this script reads")
    width = max(len(label) for label in labels) + 2
    print(f"{' '.join(bench)}: median of {args.runs} runs each, alternating")
    print(f"{'figure':<{width}}{'before':>12}{'after':>12}{'after/before':>14}")
    for label in labels:
        values = {side: [r[label] for r in sides[side] if label in r] for side in sides}
        before = statistics.median(values["before"]) if values["before"] else None
        after = statistics.median(values["after"]) if values["after"] else None
        ratio = f"{after / before:.2f}" if before and after is not None else "-"
        shown = [f"{v:.3f}" if v is not None else "-" for v in (before, after)]
        print(f"{label:<{width}}{shown[0]:>12}{shown[1]:>12}{ratio:>14}")


if __name__ == "__main__":
    main()
