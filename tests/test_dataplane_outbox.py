"""The plane's outbox (dataset/outbox.py) routes the master's "not active" answers outside the
plane's lock: it lists the plane's slots without holding its own lock (the plane calls into the
outbox holding its lock, so the other order would deadlock), and a task the sampler takes while
an answer is being routed is still warned about, once. A real dispatcher, store and plane; the
test plays the sampler taking a task at the worst moment, no timing."""

from __future__ import annotations

from test_dataplane_lapsed_leases import blocks, ready_at_a, stall

from shmloader.dataset.accounting.book import ConsumptionBook


def test_a_task_taken_while_an_answer_is_routed_is_warned_about_once(tmp_path, caplog, monkeypatch):
    with ready_at_a(tmp_path) as (d, _, plane, sampler, leases):
        to_b, later = stall(d)
        assert {(x.epoch, x.unit) for x in leases} <= {(x.epoch, x.unit) for x in to_b}
        outbox = plane.outbox
        admitted_tasks = ConsumptionBook.admitted_tasks
        own_lock_held = []

        def listing(book):
            # The plane lists its book's tasks for the outbox under the plane's lock: the
            # outbox must not hold its own (its other callers would wait on it).
            own_lock_held.append(blocks(outbox.unconfirmed))  # it takes the outbox's lock
            states = admitted_tasks(book)
            if len(own_lock_held) == 1:  # the sampler takes a task just after the listing
                (task,) = plane.ready.take_ready([(0, leases[0].unit)])
                assert len(sampler.feed.admit(task)) == task.num_rows
            return states

        monkeypatch.setattr(ConsumptionBook, "admitted_tasks", listing)
        with caplog.at_level("WARNING", logger="shmloader.dataset"):
            plane.outbox.lapsed(d.mark_taken(plane.held_leases(), later))
            warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert len(warned) == plane.lapsed_leases.tasks == 1  # by admit: the lease was noted
            assert f"this trainer's lease {leases[0].lease_id} lapsed" in warned[0]
            plane.outbox.lapsed(d.mark_taken(plane.held_leases(), later))  # the next renew cycle
        assert own_lock_held == [False, False]
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == plane.lapsed_leases.tasks == 1  # not again
