"""The ranks a block's rows get when the sampler hands them out (``book.rank_rows``):
what a pass resumed after a ``break`` reclaims its rows in. Both ways of scattering them (one
flat table for slots numbered close together, one slot at a time for slots far apart) must
give every handed-out row its place in the block, and leave everything else as it was."""

from __future__ import annotations

import numpy as np
import pytest

from shmloader.dataset.accounting.book import SlotState, rank_rows, ranked_by_table
from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.core.tasks import ReadyTask


def states(sizes: dict[int, int]) -> dict[int, SlotState]:
    return {
        slot: SlotState(ReadyTask(0, slot, slot, f"seg-{slot}", n, slot), slot)
        for slot, n in sizes.items()
    }


def expected_ranks(
    sizes: dict[int, int], indices: np.ndarray, first: int, before: dict[int, np.ndarray]
) -> dict[int, np.ndarray | None]:
    """The definition: row ``indices[i]`` of its slot gets rank ``first + i``."""
    out: dict[int, np.ndarray | None] = {s: before.get(s) for s in sizes}
    for i, index in enumerate(indices.tolist()):
        slot, row = index >> 32, index & 0xFFFFFFFF
        if slot not in sizes:
            continue
        ranks = out[slot]
        if ranks is None:
            ranks = out[slot] = np.full(sizes[slot], -1, dtype=np.int64)
        ranks[row] = first + i
    return out


@pytest.mark.parametrize(
    ("sizes", "done", "table"),
    [
        ({3: 4096, 4: 4096, 5: 100, 6: 4096}, 3, True),  # a window of tasks, one short
        ({7: 200, 9: 150, 12: 200}, None, True),  # gaps between the slots
        ({2: 10, 400: 10, 9000: 10}, 400, False),  # far apart: one slot at a time
    ],
)
def test_every_row_handed_out_gets_its_place_in_the_block(
    sizes: dict[int, int], done: int | None, table: bool
) -> None:
    rng = np.random.default_rng(len(sizes))
    parts = []
    for slot, n in sizes.items():
        rows = np.flatnonzero(rng.random(n) < 0.8)  # some rows consumed before, not issued
        parts.append(encode_indices(slot, rows))
    indices = np.concatenate(parts)[rng.permutation(sum(len(p) for p in parts))]

    slots = states(sizes)
    last = max(sizes)
    # A slot ranked by an earlier block (one elsewhere, of the pass) keeps those ranks.
    earlier = np.full(sizes[last], -1, dtype=np.int64)
    earlier[0] = 7
    slots[last].rank = earlier.copy()
    if done is not None:
        del slots[done]  # released and completed meanwhile: nothing of it left to deliver
    live = {s: n for s, n in sizes.items() if s != done}
    want = expected_ranks(live, indices, 100, {last: earlier})

    assert ranked_by_table(indices) is table  # the way this case takes
    assert rank_rows(slots, indices, 100) == 100 + len(indices)
    for slot, ranks in want.items():
        got = slots[slot].rank
        assert (got is None) == (ranks is None), slot
        if ranks is not None:
            assert got is not None
            np.testing.assert_array_equal(got, ranks)


def test_no_rows_leave_the_ranks_alone() -> None:
    slots = states({1: 5})
    assert rank_rows(slots, np.empty(0, dtype=np.int64), 9) == 9
    assert slots[1].rank is None
