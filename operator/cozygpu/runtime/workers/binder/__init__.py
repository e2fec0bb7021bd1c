"""The binder (§4, §5): the one writer of phase, nodeName and bindRequest.result.

- `loop`: the decision loop (`Binder`). One task decides one thing at a time from the cluster view, so two
  decisions never spend the same free unit; each decision counts in the view at once (assumed) and is written in
  the background through the one writer (runtime.writes).
- `queue`: the waiting room (`WaitingRoom`): what the view's changes name, handed out as each pass's work; the
  binder never polls the API.
- `dispatcher`: the write slots (`Dispatcher`): a decision takes one, hands it to its write, and it is given
  back in one place.
- `mover` (idle moves, §5.7), `confirmations` (template orders charged to their budgets, §7.4) and `reports`
  (Events, metrics and log lines of what was written) beside them, talking to the loop through the queue and
  the dispatcher; none of them imports the loop (an import-linter contract).
"""

from cozygpu.runtime.workers.binder.loop import Binder

__all__ = ["Binder"]
