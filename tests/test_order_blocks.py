"""The pure order (order/blocks.py) and the budget pressure (waiting/budget_pressure.py), alone:
no feed, no store, no threads. The order is a function of the seed and the task order only, and
a block's rest after a resume comes in the order the uninterrupted block had."""

from __future__ import annotations

import numpy as np
import pytest

from shmloader.dataset.core.indices import encode_indices
from shmloader.dataset.core.tasks import Pressure, ReadyTask
from shmloader.dataset.order.blocks import block_grid, block_order, block_permutation
from shmloader.dataset.waiting.budget_pressure import BudgetPressure

ROWS = 6


def task(seq: int, *, skipped: tuple[int, ...] = ()) -> ReadyTask:
    return ReadyTask(
        0, seq, seq, f"s{seq}", ROWS - len(skipped), 10 + seq, seq * ROWS, (seq + 1) * ROWS, skipped
    )


def rows_of(slot: int, rows: list[int]) -> np.ndarray:
    return encode_indices(slot, np.array(rows, dtype=np.int64))


def test_blocks_grow_from_the_epoch_start_and_a_continued_pass_keeps_them() -> None:
    # Blocks of 1, 2, 4, 4, ... tasks: positions 0 | 1 2 | 3 4 5 6 | 7 8 9 10 | ...
    assert [block_grid(first, 4) for first in (0, 1, 2, 3, 5, 7, 11)] == [
        (1, 1),
        (2, 2),
        (1, 2),
        (4, 4),
        (2, 4),
        (4, 4),
        (4, 4),
    ]


def test_the_permutation_is_a_function_of_its_place_only() -> None:
    a = block_permutation(7, 1, 3, 50)
    assert a.tolist() == block_permutation(7, 1, 3, 50).tolist()
    assert sorted(a.tolist()) == list(range(50))
    assert a.tolist() != block_permutation(7, 1, 4, 50).tolist()
    assert a.tolist() != block_permutation(8, 1, 3, 50).tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resumed_block_delivers_its_rest_in_the_uninterrupted_order(shuffle: bool) -> None:
    tasks = [task(3), task(4)]
    whole = block_order(
        tasks,
        [rows_of(1, list(range(ROWS))), rows_of(2, list(range(ROWS)))],
        epoch=0,
        seed=5,
        shuffle=shuffle,
    )
    assert sorted(whole.tolist()) == sorted(
        np.concatenate([rows_of(1, list(range(ROWS))), rows_of(2, list(range(ROWS)))]).tolist()
    )
    consumed = set(whole[:5].tolist())  # the loaded state consumed the first five
    rest = [
        np.array([i for i in rows_of(slot, list(range(ROWS))).tolist() if i not in consumed])
        for slot in (1, 2)
    ]
    again = block_order(tasks, rest, epoch=0, seed=5, shuffle=shuffle)
    assert again.tolist() == whole[5:].tolist()


def test_records_the_source_skipped_keep_their_place_in_the_order() -> None:
    """Task 3 skipped record 19 (its row 1 is record 20): the layout is by record, so the
    other rows sit where they would with nothing skipped."""
    plain = block_order([task(3)], [rows_of(1, list(range(ROWS)))], epoch=0, seed=1, shuffle=True)
    skipping = task(3, skipped=(19,))
    got = block_order(
        [skipping], [rows_of(1, list(range(ROWS - 1)))], epoch=0, seed=1, shuffle=True
    )
    row = [int(i) & 0xFFFFFFFF for i in got.tolist()]
    records = [18 + r + (18 + r >= 19) for r in row]  # rows past the skipped record shift by one
    assert records == [
        18 + (int(i) & 0xFFFFFFFF) for i in plain.tolist() if int(i) & 0xFFFFFFFF != 1
    ]


def test_no_task_no_rows() -> None:
    assert block_order([], [], epoch=0, seed=0, shuffle=True).tolist() == []


@pytest.mark.parametrize(
    ("starved", "blocked", "unconsumed", "stuck", "pressure"),
    [
        (False, False, 5, False, Pressure.NONE),
        (True, False, 5, False, Pressure.STARVED),
        (True, True, 5, False, Pressure.BLOCKED),
        (False, True, 5, True, Pressure.PINNED),
        (False, True, 0, False, Pressure.DEAD_END),
    ],
)
def test_budget_pressure_says_how_the_budget_stands_for_the_wait(
    starved: bool, blocked: bool, unconsumed: int, stuck: bool, pressure: Pressure
) -> None:
    budget = BudgetPressure(
        starved=lambda: starved, blocked=lambda: blocked, unconsumed_rows=lambda: unconsumed
    )
    assert budget.now(lambda: stuck) is pressure
    assert budget.pinned(unconsumed) is blocked and budget.dead_end() is (
        blocked and not unconsumed
    )
