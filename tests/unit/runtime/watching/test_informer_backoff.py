"""A watch's retry backoff (§10, issue 12): it grows while attempts keep failing at once, and starts anew for a
stream that had been working, so API server restarts minutes apart each recover at the first delay."""

from __future__ import annotations

from cozygpu.runtime.watching.informer import HEALTHY, failures_after


def test_failures_in_a_row_grow_the_backoff_and_a_working_stream_resets_it() -> None:
    """Failing within HEALTHY seconds of the attempt counts on; failing after a stream was up longer is a first."""
    assert failures_after(0, 0.1) == 1
    assert failures_after(3, 0.1) == 4
    assert failures_after(3, HEALTHY - 0.1) == 4
    assert failures_after(7, HEALTHY + 0.1) == 1
