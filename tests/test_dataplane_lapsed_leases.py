"""What a trainer keeps of its leases that went to another consumer (dataset/lapsed_leases.py).

A lapsed lease the trainer still holds fails every renew cycle: its reason is logged once, not
once per cycle, and not while the plane's lock is held (the sampler and the training loop need
it). What is kept of a lease goes once its task completes here, once its ready copy is
dropped, or once the plane forgets its epoch. A real dispatcher, store and plane; no processes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable

from _dataplane_helpers import announce, trainer
from test_dataplane_shared import dispatcher

from shmloader.dataset.gather.gatherer import Gatherer


def kept(plane) -> int:
    return len(plane.lapsed_leases.kept_leases())


def blocks(call: Callable[[], object]) -> bool:
    """Whether ``call``, made in another thread, waits: for a lock this thread holds (the
    thread goes on once it is let go)."""
    other = threading.Thread(target=call, daemon=True)
    other.start()
    other.join(timeout=5)
    return other.is_alive()


def stall(d):
    """a's leases lapse (a declared dead) and b gets every task; a registers again."""
    later = time.time() + d.config.consumer_timeout + 1
    d.heartbeat("b", later)
    d.expire(later)
    d.register("a", later)
    return d.lease("b", 100, later), later


@contextlib.contextmanager
def ready_at_a(tmp_path):
    """Trainer a with every task of epoch 0 (of 2) ready, none taken yet; b is registered."""
    d = dispatcher(epochs=2)
    store, plane, sampler = trainer(d, "a", tmp_path / "a")
    d.register("b", time.time())
    with store:
        leases = [x for x in d.lease("a", 100, time.time()) if x.epoch == 0]
        for lease in leases:
            announce(store, plane, lease)
        yield d, store, plane, sampler, leases


def test_a_lapsed_lease_is_logged_once_outside_the_lock_and_forgotten_when_done(tmp_path, caplog):
    with ready_at_a(tmp_path) as (d, store, plane, sampler, _):
        it = iter(sampler)
        first = list(itertools.islice(it, 3))  # the sampler took some tasks
        to_b, later = stall(d)
        assert to_b
        held = plane.held_leases()
        lock_held: list[bool] = []

        class Spy(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno == logging.INFO:
                    lock_held.append(blocks(plane.held_leases))  # it takes the plane's lock

        spy = Spy()
        logging.getLogger("shmloader.dataset").addHandler(spy)
        try:
            with caplog.at_level("INFO", logger="shmloader.dataset"):
                for _ in range(3):  # three renew cycles, each answered the same
                    plane.outbox.lapsed(d.mark_taken(held, later))
        finally:
            logging.getLogger("shmloader.dataset").removeHandler(spy)
        infos = [r for r in caplog.records if r.levelname == "INFO"]
        assert len(infos) == len(held)  # once per lease, not once per cycle
        assert lock_held and not any(lock_held)  # logged outside the plane's lock
        assert plane.lapsed_leases.tasks > 0  # and the tasks taken were warned about
        assert kept(plane) > 0
        # a delivers the rest of its pass (this plane checks no lease: it delivers every
        # copy) and completes each task: nothing is kept of their leases any more.
        rest = list(it)
        Gatherer(store.handle(), ["id"]).gather(first + rest)
        plane.read_ledger_and_send()
        assert kept(plane) == 0


def test_what_is_kept_goes_with_a_forgotten_epoch(tmp_path):
    with ready_at_a(tmp_path) as (d, _, plane, sampler, leases):  # ready, never taken
        _, later = stall(d)
        plane.outbox.lapsed(d.mark_taken(plane.held_leases(), later))
        epochs = plane.lapsed_leases.kept_leases()
        assert epochs == {x.lease_id: 0 for x in leases}  # each lease's epoch, kept
        sampler.feed.finish_epoch(0)
        plane.forget_finished(1)  # the master finished epoch 0 (b delivered it)
        assert kept(plane) == 0


def test_a_late_answer_about_a_lease_completed_here_is_not_kept(tmp_path):
    """A renew cycle lists the held leases, the loop completes some of their tasks, then the
    master's answer says those "were completed": nothing is kept of them (it was, one entry
    per such race for the trainer's life: 35 after 400 short epochs of a real dataset)."""
    with ready_at_a(tmp_path) as (d, store, plane, sampler, _):
        held = plane.held_leases()  # what a renew cycle sends
        indices = list(sampler)  # the pass takes every task of epoch 0 ...
        Gatherer(store.handle(), ["id"]).gather(indices)
        plane.read_ledger_and_send()  # ... and completes them
        assert kept(plane) == 0
        for _ in range(3):  # the cycle's answers come after: "lease N is not active: it was
            plane.outbox.lapsed(d.mark_taken(held, time.time()))  # completed at ..."
        assert kept(plane) == 0
