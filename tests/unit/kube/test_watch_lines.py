"""A watch stream's lines cut from its chunks (kube.watch.lines): what a split of the whole stream gives, for any
way the stream arrives in chunks, and every byte copied a bounded number of times (issue 34 item 2)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from cozygpu.kube.watch import lines


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


EVENTS = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8)


@given(EVENTS, st.booleans(), st.lists(st.integers(min_value=0), max_size=20))
def test_lines_are_what_splitting_the_whole_stream_gives_however_it_is_chunked(
    events: list[bytes], trailing: bool, cuts: list[int]
) -> None:
    """Newline-separated events, with or without a newline after the last, in any chunks: the same lines."""
    data = b"\n".join(events) + (b"\n" if trailing and events else b"")
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert list(lines(_chunked(data, cuts))) == expected


class _Counted(bytes):
    """A chunk that counts how often `find` looks into it."""

    finds = 0

    def find(self, *args: object) -> int:  # type: ignore[override]
        _Counted.finds += 1
        return super().find(*args)  # type: ignore[arg-type]


def test_a_long_line_in_small_chunks_is_looked_at_once_per_chunk() -> None:
    """A 1.35 MiB event in 512-byte chunks, as the issue measured it: each chunk is searched once for the end of
    the line, and nothing pending is searched again (requests' iter_lines split everything pending at every chunk,
    about 2,700 times for this line: 1.18 s of CPU against 4.6 ms)."""
    line = b"x" * (1350 * 1024)
    chunks = [_Counted(line[i : i + 512]) for i in range(0, len(line), 512)] + [_Counted(b"\n")]
    _Counted.finds = 0
    assert list(lines(chunks)) == [line]
    assert _Counted.finds == len(chunks) + 1  # one miss per chunk, and the hit in the last one
