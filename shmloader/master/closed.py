"""The dispatcher's memory of leases that are no longer active: why lease X is not active, and
who got its task.

A lease closes when it is completed, reported failed, taken back (its deadline passed, or its
consumer left or was declared dead) or its epoch finished. Its holder may still ask about it (a
renew, complete or taken call from a trainer that stalled), so the dispatcher remembers, for the
last ``GONE_MEMORY`` closed leases, a sentence saying why (``not_active``), and for those whose
task was handed out again, the new lease and its consumer (``LeaseError.handed_to``), so the old
holder can warn that the task's rows may come twice.

A lease taken back *lapses*: until somebody is granted its task again, its holder may still
complete it (its rows reached training: counted once, ``complete_late``). Granting the task
again (``regranted``) or finishing the epoch (``epoch_closed``) ends that.

Only the dispatcher's apply handlers change this (it is rebuilt by a journal's replay like the
rest of the state); ``snapshot.py`` dumps and loads it as the "lapsed", "gone" and "handed" fields
of a state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import LeaseError
from .progress import Lease

# Closed leases whose fate is remembered for error messages (oldest forgotten first).
GONE_MEMORY = 10_000


class ClosedLeases:
    """Lapsed leases, why closed leases are not active, and who got their task."""

    def __init__(self, memory: int = GONE_MEMORY) -> None:
        self._memory = memory
        # Taken back, and nobody has been granted their unit since: their holder may still
        # complete them. By lease id, and by (epoch, unit) to find them when the unit goes out.
        self._lapsed: dict[int, Lease] = {}
        self._by_unit: dict[tuple[int, int], int] = {}
        self._gone: OrderedDict[int, str] = OrderedDict()
        # Lapsed leases whose unit was handed out again -> (new lease id, its consumer), for
        # the old holder; pruned with ``_gone``, rebuilt by replaying LeaseGranted.
        self._handed: dict[int, tuple[int, str]] = {}

    # ----------------------------------------------------------------- queries

    def lapsed(self, lease_id: int) -> Lease | None:
        """The lapsed lease ``lease_id`` (its holder may still complete it), or None."""
        return self._lapsed.get(lease_id)

    def not_active(self, lease_id: int) -> LeaseError:
        """Why ``lease_id`` is not active, naming who got its task if it went out again."""
        why = self._gone.get(lease_id)
        if why is None:
            return LeaseError(
                f"lease {lease_id} is unknown to this master: never granted, or closed too long "
                "ago to be remembered"
            )
        error = LeaseError(f"lease {lease_id} is not active: {why}")
        if lease_id in self._handed:
            error.handed_as, error.handed_to = self._handed[lease_id]
        return error

    # ----------------------------------------------------------------- changes

    def lapse(self, lease: Lease, why: str) -> None:
        """``lease`` was taken back (expired, its consumer gone): its holder may complete it
        late until its unit goes out again."""
        self._lapsed[lease.lease_id] = lease
        self._by_unit[(lease.epoch, lease.unit)] = lease.lease_id
        self.forget(lease.lease_id, why)

    def forget(self, lease_id: int, why: str) -> None:
        """``lease_id`` closed because ``why``; the oldest closed leases past the memory go."""
        self._gone[lease_id] = why
        while len(self._gone) > self._memory:
            self._handed.pop(self._gone.popitem(last=False)[0], None)

    def regranted(self, epoch: int, unit: int, lease_id: int, consumer: str) -> None:
        """``unit`` of ``epoch`` went out as ``lease_id`` to ``consumer``: a lease of it that
        lapsed can no longer be completed late, and its holder is told who got it."""
        old_id = self._by_unit.pop((epoch, unit), None)
        if old_id is None:
            return
        old = self._lapsed.pop(old_id)
        self.forget(
            old_id,
            f"{self._gone.pop(old_id, 'it lapsed')}, and task {old.task.task_id} of epoch {epoch} "
            f"was handed out again as lease {lease_id} to {consumer!r}",
        )
        self._handed[old_id] = (lease_id, consumer)

    def complete_late(self, lease_id: int) -> Lease:
        """The holder of lapsed ``lease_id`` completed it: it is no longer lapsed (the caller
        completes its unit late and records why it is closed)."""
        lease = self._lapsed.pop(lease_id)
        del self._by_unit[(lease.epoch, lease.unit)]
        self._gone.pop(lease_id, None)
        return lease

    def epoch_closed(self, epoch: int) -> None:
        """``epoch`` finished: its lapsed leases can no longer be completed."""
        for key in [k for k in self._by_unit if k[0] == epoch]:
            lease_id = self._by_unit.pop(key)
            del self._lapsed[lease_id]
            self.forget(
                lease_id,
                f"{self._gone.pop(lease_id, 'it lapsed')}, and epoch {epoch} has finished since",
            )

    # ----------------------------------------------------------------- states

    def to_state(self, lease_state: Callable[[Lease], dict[str, Any]]) -> dict[str, Any]:
        """The "lapsed", "gone" and "handed" fields of a dispatcher state (see snapshot.py)."""
        return {
            "lapsed": [lease_state(x) for _, x in sorted(self._lapsed.items())],
            "gone": [[lease_id, why] for lease_id, why in self._gone.items()],
            "handed": [[old, new, who] for old, (new, who) in sorted(self._handed.items())],
        }

    def load_state(
        self, state: dict[str, Any], make_lease: Callable[[dict[str, Any]], Lease]
    ) -> None:
        """Replace what is kept with a state's fields (``to_state``)."""
        self._lapsed.clear()
        self._by_unit.clear()
        for x in state["lapsed"]:
            lease = make_lease(x)
            self._lapsed[lease.lease_id] = lease
            self._by_unit[(lease.epoch, lease.unit)] = lease.lease_id
        self._gone = OrderedDict((int(i), str(why)) for i, why in state["gone"])
        # States saved before it was kept have no "handed": their old holders are not told.
        handed = state.get("handed", [])
        self._handed = {int(old): (int(new), str(who)) for old, new, who in handed}
