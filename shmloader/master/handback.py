"""Handing back partly consumed tasks: what a trainer leaving an elastic job had consumed.

Trainers that share a master's epochs (elastic mode) each deliver the tasks their readers
leased. One that leaves cleanly (``Leave``) may be in the middle of some: the loop received
part of their rows. Those tasks go back to the queue, and without more, whoever leases one
next delivers it whole again: duplicates. So ``Leave`` carries, per lease of a partly consumed
task, the record ranges consumed of it; the dispatcher records them with the unit
(:class:`~.updates.LeaseHandedBack`, journaled, replayed like every update), every later lease
of the unit in the epoch carries them (``Lease.consumed``), and the trainer that gets it skips
those rows. Ranges accumulate when that trainer leaves partway too; a holder that dies hands
nothing back (its rows come again), but what earlier holders handed back stays with the unit.

A trainer that saves its state (``state_dict()``) also reports to the master what that state counts
of its leases (``Checkpoint``, :class:`~.updates.LeaseCheckpointed`): should it die and its
leases lapse before anyone resumes from that state, the master hands those ranges back for it.
Rows a checkpoint counts then never come again from another trainer, however late the restart.

DDP mode keeps nothing: a rank's queue is its own, and a rank that comes back resumes from its
checkpoint.
"""

from __future__ import annotations

from ..errors import ConfigError
from .snapshot import ConsumerState, DispatcherState
from .tasks import merge_ranges
from .updates import LeaseCheckpointed, LeaseHandedBack
from .wire import HandBack


def handed_back(
    state: DispatcherState,
    consumer: ConsumerState,
    consumed: HandBack | None,
    now: float,
    record: type[LeaseHandedBack | LeaseCheckpointed] = LeaseHandedBack,
) -> list[LeaseHandedBack | LeaseCheckpointed]:
    """The updates (``record``: handed back by a leaving consumer, or counted by a saved state)
    that record ``consumed`` (lease id -> record ranges) for the leases of ``consumer`` (what
    the dispatcher's ``state`` knows of it), checked before any applies: ranges of leases it
    does not hold (any more) and of DDP leases are left out, ranges outside a lease's unit
    raise ConfigError. Reads the state, changes nothing: the dispatcher applies what comes
    back."""
    out = []
    for lease_id, ranges in sorted((consumed or {}).items()):
        lease = state.leases.get(lease_id)
        merged = tuple(merge_ranges(ranges))
        if lease_id not in consumer.leases or lease is None or lease.rank is not None or not merged:
            continue
        bad = state.open[lease.epoch].outside(lease.unit, merged)
        if bad is not None:
            raise ConfigError(
                f"lease {lease_id}: consumed records [{bad[0]}, {bad[1]}) are not within its "
                f"task's records [{lease.task.start}, {lease.task.stop})"
            )
        out.append(record(now, lease_id, merged))
    return out
