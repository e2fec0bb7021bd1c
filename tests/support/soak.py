"""How long the reliability scenarios run, and what they report (issue 12 item 4).

`make test` runs each scenario briefly; `make soak` sets COZYGPU_SOAK=1 and each runs
its soak count instead, within COZYGPU_SOAK_MINUTES per scenario (a scenario that runs
out of time stops early and says so). Every scenario records its runs, violations and
recovery times in `TALLY`; the reliability conftest prints them at the end.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

SOAK = os.environ.get("COZYGPU_SOAK", "") == "1"
MINUTES = float(os.environ.get("COZYGPU_SOAK_MINUTES", "60"))


def runs(default: int, soak: int) -> int:
    """How many runs a scenario makes: `soak` under make soak, else `default`."""
    return soak if SOAK else default


@dataclass
class Record:
    runs: int = 0
    violations: list[str] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)  # seconds from a fault's end to ready and working
    note: str = ""


TALLY: dict[str, Record] = defaultdict(Record)


class Budget:
    """A scenario's time under the soak: `left` turns False once COZYGPU_SOAK_MINUTES have passed."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.deadline = time.monotonic() + MINUTES * 60

    def left(self) -> bool:
        if not SOAK or time.monotonic() < self.deadline:
            return True
        TALLY[self.scenario].note = f"stopped after {MINUTES:g} minutes"
        return False


def report() -> list[str]:
    lines = []
    for name, r in sorted(TALLY.items()):
        line = f"{name}: {r.runs} runs, {len(r.violations)} violations"
        if r.recoveries:
            ordered = sorted(r.recoveries)
            line += f"; recovery p50 {ordered[len(ordered) // 2]:.2f} s, max {ordered[-1]:.2f} s"
        if r.note:
            line += f" ({r.note})"
        lines.append(line)
        lines += [f"  violation: {v}" for v in r.violations[:20]]
    return lines
