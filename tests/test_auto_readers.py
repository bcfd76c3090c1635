"""``num_readers="auto"``: the decision on figures made for each case, and a real dataset that
adds a reader while the loop waits on a slow one and retires it when the loop slows down,
every record once per epoch throughout."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from _dataset_helpers import dataset, ids_of, write_dataset

import shmloader
from shmloader.dataset.runtime.reader_scaling import (
    CEILING_WINDOWS,
    IDLE_WINDOWS,
    ReaderScaling,
    Scale,
    ScalingWindow,
    auto_bounds,
)


def window(**figures: float) -> ScalingWindow:
    base: dict[str, float] = {
        "sampler_wait": 0.0,
        "reader_busy": 0.5,
        "reader_budget_wait": 0.0,
        "spare_cores": 1.0,
        "rows_per_second": 1000.0,
    }
    base.update(figures)
    return ScalingWindow(**base)


STARVED = {"sampler_wait": 0.5, "reader_busy": 0.95, "spare_cores": 1.0}


def test_a_reader_is_added_while_the_loop_waits_and_kept_when_the_loop_got_faster():
    scaling = ReaderScaling(1, 4)
    assert scaling.decide(1, window(**STARVED, rows_per_second=1000)) is Scale.ADD
    assert scaling.decide(2, window(**STARVED)) is Scale.HOLD  # cooldown: the reader starts
    assert scaling.decide(2, window(**STARVED, rows_per_second=1800)) is Scale.ADD  # it paid


def test_a_reader_that_did_not_pay_is_retired_and_the_count_is_a_ceiling_for_a_while():
    scaling = ReaderScaling(1, 4)
    assert scaling.decide(1, window(**STARVED, rows_per_second=1000)) is Scale.ADD
    assert scaling.decide(2, window(**STARVED)) is Scale.HOLD
    assert scaling.decide(2, window(**STARVED, rows_per_second=1020)) is Scale.RETIRE
    held = [scaling.decide(1, window(**STARVED)) for _ in range(CEILING_WINDOWS - 2)]
    assert set(held) == {Scale.HOLD}  # starved all the while, but one reader is the ceiling
    assert scaling.decide(1, window(**STARVED)) is Scale.HOLD
    assert scaling.decide(1, window(**STARVED)) is Scale.ADD  # tried again, later


def test_no_reader_is_added_without_free_cores_at_the_bound_or_for_readers_that_wait_for_room():
    assert ReaderScaling(1, 4).decide(2, window(**{**STARVED, "spare_cores": 0.1})) is Scale.HOLD
    assert ReaderScaling(1, 2).decide(2, window(**STARVED)) is Scale.HOLD
    room = {**STARVED, "reader_busy": 0.2, "reader_budget_wait": 0.8}
    assert ReaderScaling(1, 4).decide(2, window(**room)) is Scale.HOLD
    between_epochs = {**STARVED, "rows_per_second": 0.0}
    assert ReaderScaling(1, 4).decide(1, window(**between_epochs)) is Scale.HOLD


def test_a_reader_is_retired_after_windows_in_which_the_others_could_do_its_work():
    scaling = ReaderScaling(1, 4)
    idle = window(sampler_wait=0.0, reader_busy=0.3)  # 3 readers' work: 0.45 each for 2
    for _ in range(IDLE_WINDOWS - 1):
        assert scaling.decide(3, idle) is Scale.HOLD
    assert scaling.decide(3, idle) is Scale.RETIRE


def test_no_reader_is_retired_when_the_rest_would_be_too_busy_or_at_the_lower_bound():
    scaling = ReaderScaling(1, 4)
    busy = window(sampler_wait=0.0, reader_busy=0.45)  # 2 readers' work: 0.9 for one
    assert all(scaling.decide(2, busy) is Scale.HOLD for _ in range(5))
    lone = ReaderScaling(1, 4)
    assert all(lone.decide(1, window(reader_busy=0.0)) is Scale.HOLD for _ in range(5))
    # A window in which the loop waited breaks a run of idle ones.
    scaling = ReaderScaling(1, 4)
    idle = window(sampler_wait=0.0, reader_busy=0.1)
    for _ in range(IDLE_WINDOWS - 1):
        scaling.decide(3, idle)
    assert scaling.decide(3, window(sampler_wait=0.05, reader_busy=0.1)) is Scale.HOLD
    assert scaling.decide(3, idle) is Scale.HOLD


def test_the_bounds_are_one_and_the_cores_this_process_may_use():
    low, high = auto_bounds()
    assert low == 1 and high >= 1


@pytest.mark.long
def test_auto_adds_a_reader_for_a_slow_decode_and_retires_it_for_a_slow_loop(tmp_path):
    expected = Counter(write_dataset(tmp_path / "data", [1500, 1500]))
    _, high = auto_bounds()
    with dataset(
        tmp_path / "data",
        tmp_path / "shm",
        num_readers="auto",
        slow=True,  # 2 ms a record (a sleep: the cores stay free)
        epochs=None,
        shuffle_window=2,  # readers read only a few tasks ahead: their busy share is the need
    ) as ds:
        loader = shmloader.DataLoader(ds, batch_size=50)
        # Fast: the loop waits on one reader. A pass takes 6 s with one; windows are 2 s.
        for _ in range(3):
            assert Counter(i for batch in loader for i in ids_of(batch)) == expected
            if len(ds.stats().readers) >= 2 or high < 2:
                break
        added = ds.stats().readers
        # Slow: 200 records/s, under half of one reader's 500; fast again once one retired.
        retired = False
        for _ in range(2):
            seen: Counter[int] = Counter()
            for batch in loader:
                seen.update(ids_of(batch))
                if not retired:
                    time.sleep(0.25)
                    retired = any(not r.alive for r in ds.stats().readers)
            assert seen == expected
            if retired:
                break
        after = ds.stats().readers
    if high < 2:  # one core: one reader throughout
        assert len(added) == len(after) == 1
        return
    assert len(added) >= 2, added  # added while the loop waited
    assert retired, after  # and retired once the loop slowed down
    gone = [r for r in after if not r.alive]
    assert gone and all(r.restarts == 0 for r in gone)
    assert sum(r.alive for r in after) >= 1


def test_auto_is_refused_misspelt(tmp_path):
    write_dataset(tmp_path / "data", [10])
    try:
        dataset(tmp_path / "data", tmp_path / "shm", num_readers="Auto")
    except shmloader.ConfigError as exc:
        assert 'or "auto"' in str(exc)
    else:
        raise AssertionError("num_readers='Auto' was accepted")
