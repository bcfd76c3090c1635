"""States saved before master/closed.py took over the memory of closed leases still load.

The dispatcher's "lapsed", "gone" and "handed" fields moved behind ClosedLeases without a
change of format: a state saved by the dispatcher before (below, as it wrote it: slow's lease 1
lapsed, its lease 2 lapsed and handed out again as lease 5 to fast, lease 4 completed, lease 3
taken) loads, is dumped again unchanged, and answers as it did. No network, no clock.
"""

from __future__ import annotations

import copy
import json

import pytest

from shmloader.errors import LeaseError
from shmloader.master import Dispatcher, JobConfig
from shmloader.sources.base import Shard

PLAN = [Shard("a", 10), Shard("b", 6)]
# Written by the dispatcher of commit 39cec9e (register slow and fast at 0; slow leases 1-3 and
# takes 3; fast leases 4 and completes it; expire at 11; fast leases 5 at 11.5).
SAVED = json.loads(
    '{"format": 1, "schedule": {"records_per_task": 4, "seed": 0, "shuffle": false, "world_size":'
    ' null, "ddp_policy": "pad", "resume": null, "plan": '
    '"a0efa52a9b210d568689beae06a8388199c7f4be40cc4cf6ae4cfb35f051a447"}, "incarnation": 0, '
    '"next_lease_id": 6, "epochs_started": 1, "open_epochs": [{"epoch": 0, "cursor": [4], '
    '"retry": [[0]], "failures": [[0, 1], [1, 1]], "quarantined": [], "consumed": []}], '
    '"closed_epochs": [], "consumers": [{"consumer": "fast", "rank": null, "last_seen": 11.5}, '
    '{"consumer": "slow", "rank": null, "last_seen": 11.0}], "leases": [{"lease_id": 3, '
    '"consumer": "slow", "epoch": 0, "unit": 2, "attempt": 1, "deadline": 10.0, "taken": true}, '
    '{"lease_id": 5, "consumer": "fast", "epoch": 0, "unit": 1, "attempt": 2, "deadline": 21.5, '
    '"taken": false}], "lapsed": [{"lease_id": 1, "consumer": "slow", "epoch": 0, "unit": 0, '
    '"attempt": 1, "deadline": 10.0, "taken": false}], "gone": [[4, "it was completed at t=1.0; '
    'task 3 of epoch 0 is counted once"], [1, "it was taken back at t=11.0: lease 1 held by '
    "'slow' expired at t=10.0\"], [2, \"it was taken back at t=11.0: lease 2 held by 'slow' expired"
    ' at t=10.0, and task 1 of epoch 0 was handed out again as lease 5 to \'fast\'"]], "handed": '
    '[[2, 5, "fast"]], "counters": {"granted": 5, "completed": 1, "late_completed": 0, "failed": '
    '0, "expired": 2, "released": 0}}'
)


def make() -> Dispatcher:
    config = JobConfig(
        records_per_task=4, shuffle=False, epochs=2, lease_timeout=10.0, consumer_timeout=30.0
    )
    return Dispatcher(PLAN, config)


def test_a_state_saved_before_loads_and_is_dumped_unchanged() -> None:
    d = make()
    d.load_state_dict(copy.deepcopy(SAVED))
    assert json.loads(json.dumps(d.state_dict())) == SAVED
    # Lease 2 went to fast: slow is told who got it.
    with pytest.raises(LeaseError, match="handed out again as lease 5 to 'fast'") as e:
        d.complete(2, 12.0)
    assert (e.value.handed_to, e.value.handed_as) == ("fast", 5)
    # Lease 1 lapsed and nobody got its unit since: completed late, counted once.
    d.complete(1, 12.0)
    assert d.progress().counters["late_completed"] == 1
    with pytest.raises(LeaseError, match=r"it was completed at t=12\.0"):
        d.complete(1, 13.0)
    with pytest.raises(LeaseError, match=r"it was completed at t=1\.0"):
        d.renew(4, 13.0)


def test_a_state_saved_before_handed_was_kept_loads_and_names_nobody() -> None:
    old = copy.deepcopy(SAVED)
    del old["handed"]
    d = make()
    d.load_state_dict(old)
    with pytest.raises(LeaseError, match="handed out again") as e:
        d.complete(2, 12.0)
    assert e.value.handed_to is None
    assert d.state_dict()["handed"] == []
