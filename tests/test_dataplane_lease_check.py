"""A ready task whose lease lapsed is not delivered by the trainer that stalled with it.

The master keeps a lease once the trainer took its task (test_dispatcher_long_hold.py), but a task
that is only ready (sealed, not taken) lapses after ``lease_timeout`` and may go to another
trainer. The sampler takes a ready task only while its lease is surely active; after a stall it
asks the master, and drops its copy when the lease lapsed (the task is then elsewhere: it comes
back to whichever trainer holds it now). A real dispatcher, store and plane; no processes.
"""

from __future__ import annotations

import time

from _dataplane_helpers import SHARDS, announce, trainer

from shmloader.master.config import JobConfig
from shmloader.master.dispatcher import Dispatcher
from shmloader.reader.messages import lease_clock

LEASE = 10.0


def test_after_a_stall_only_ready_tasks_still_leased_here_are_delivered(tmp_path):
    config = JobConfig(records_per_task=8, epochs=1, seed=3, lease_timeout=LEASE)
    d = Dispatcher(SHARDS, config)
    store, plane, sampler = trainer(d, "a", tmp_path / "a", lease_timeout=LEASE)
    d.register("b", time.time())
    with store:
        now = time.time()
        fresh, *rest = d.lease("a", 5, now)
        stale = lease_clock() - LEASE  # confirmed a whole lease_timeout ago: a stalled
        segments = {x.lease_id: announce(store, plane, x, stale) for x in rest}
        announce(store, plane, fresh, lease_clock())
        # The stall: a renewed nothing; the master let its ready (untaken) leases lapse.
        later = now + LEASE + 1
        d.heartbeat("a", later)
        d.heartbeat("b", later)
        d.renew(rest[0].lease_id, later - 1)  # still active, but a has not heard so
        d.renew(fresh.lease_id, later - 1)
        assert len(d.expire(later)) == 3
        (to_b,) = d.lease("b", 1, later)  # one lapsed task goes to b
        (again,) = d.lease("a", 1, later)  # one to a's own readers again
        by_unit = {x.unit: x for x in rest[1:]}
        went_to_b, came_back = by_unit.pop(to_b.unit), by_unit.pop(again.unit)
        (queued,) = by_unit.values()  # one waits in the queue

        def admit(lease) -> int:
            (task,) = plane.ready.take_ready([(0, lease.unit)])
            return len(sampler.feed.admit(task))

        # Fresh: taken without asking the master (marked later, by poll).
        assert admit(fresh) == fresh.task.num_records
        assert not d.get_lease(fresh.lease_id).taken
        # Stale but still active: the master is asked (and marks it taken at once).
        assert admit(rest[0]) == rest[0].task.num_records
        assert d.get_lease(rest[0].lease_id).taken
        # Lapsed and handed to this trainer's own readers: one copy is delivered, this one.
        assert admit(came_back) == came_back.task.num_records
        # Lapsed and handed to b, or waiting in the queue: not delivered here; elsewhere now.
        assert admit(went_to_b) == 0 and admit(queued) == 0
        assert plane.lease_check.dropped == 2
        assert {(0, went_to_b.unit), (0, queued.unit)} <= plane.elsewhere.tasks
        names = set(store.segments())
        assert segments[went_to_b.lease_id] not in names
        assert segments[queued.lease_id] not in names
        # The queued task comes back to a's readers: the new copy is welcome (one elsewhere, ready).
        (back,) = d.lease("a", 1, later)
        assert back.unit == queued.unit
        announce(store, plane, back, lease_clock())
        assert [t.seq for t in plane.elsewhere.take_ready()] == [queued.unit]
