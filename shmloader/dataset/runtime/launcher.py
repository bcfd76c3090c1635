"""``master="torchrun"``: rank 0 hosts the master, the other ranks find it in the launcher's store.

Under torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` and serves a ``torch.distributed.TCPStore`` there) nobody has to start a
standalone master or pass its address around: rank 0's dataset starts an embedded master with
``world_size`` = the job's and writes its address under a key of the store, and every other
rank reads it from there when its dataset starts. The key names the dataset's number in its
process (the k-th dataset made with ``master="torchrun"``), so a train and a validation dataset
each get their own master; every rank must make them in the same order, as one script does.

The store outlives a restarted round of torchrun, and restart counts differ between machines
(only the agent whose worker failed counts one), so neither can tell a round's key apart: an
address is taken only once something listens there. With it goes a nonce of that master's, under
which each rank marks that it closed its dataset; rank 0 keeps its master up until every other
rank did.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from ..._env import seconds_from_env
from ...errors import ConfigError, MasterError

if TYPE_CHECKING:
    from torch.distributed import Store

log = logging.getLogger(__name__)

TORCHRUN = "torchrun"
# Rank 0 starts its master with its dataset (at the first batch), which may come a while after
# the other ranks' datasets start, e.g. after loading a large model: wait as long as torch's
# own collectives do by default. Rank 0's close waits as long for the others to close theirs.
LOOKUP_SECONDS = 600.0
CLOSE_SECONDS = 600.0
CONNECT_SECONDS = 60.0
# How long a rank's state_dict() waits for the other ranks' states of the same call. Ranks of a
# DDP job reach one step within a step of each other; a call made on some ranks only is said
# after this, with the fix. $SHMLOADER_STATE_SECONDS sets it (steps longer than this).
STATE_SECONDS = 180.0
STATE_ENV = "SHMLOADER_STATE_SECONDS"
RETRY_SECONDS = 0.2  # between looks at the store while the address found does not answer
LOG_EVERY = 30.0
WILDCARD_HOSTS = ("0.0.0.0", "::")  # every interface: reached at another address
_numbers = itertools.count()  # datasets made with master="torchrun" in this process


@dataclass
class Rendezvous:
    """Where this rank stands in the launched job, and where the master's address is kept."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    key: str
    bind_host: str  # where rank 0's master listens
    advertise_host: str  # how the other ranks reach it
    nonce: str | None = field(default=None, compare=False)  # the master's, once known
    # Ranks rank 0's master was seen to hear from while a state was gathered (share_state).
    seen_alive: set[int] = field(default_factory=set, compare=False)
    # The connection share_state keeps to the store (one per state taken would cost a connect).
    _sharing: Store | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def hosts_master(self) -> bool:
        return self.rank == 0

    def publish(self, port: int) -> str:
        """Rank 0: tell the other ranks where its master listens; returns that address."""
        host = self.advertise_host
        address = (
            f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        )
        if self.world_size > 1:
            self.nonce = uuid.uuid4().hex
            with self._store_errors():
                self._store().set(self.key, f"{self.nonce} {address}")
        return address

    def lookup(self, timeout: float = LOOKUP_SECONDS) -> str:
        """Ranks but 0: the address rank 0 published, once something listens there (an address
        left by an earlier round's master does not answer), waiting up to ``timeout``."""
        store = self._store()
        deadline = time.monotonic() + timeout
        found = ""
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise RuntimeError("timed out")
                store.wait([self.key], timedelta(seconds=left))
            except RuntimeError as exc:  # torch's DistStoreError: the wait timed out
                seen = f"; the address found there, {found}, did not answer" if found else ""
                raise MasterError(
                    f"rank {self.rank}: rank 0 did not publish its master's address within "
                    f"{timeout:.0f} s (key {self.key!r} of the launcher's store at "
                    f"{self.store_host}:{self.store_port}{seen}). Rank 0 starts its master with "
                    "its dataset's first batch (or SharedTaskDataset.start()); did it get there?"
                ) from exc
            with self._store_errors():
                nonce, _, found = bytes(store.get(self.key)).decode().partition(" ")
            if _answers(found):
                self.nonce = nonce
                return found
            time.sleep(RETRY_SECONDS)

    def share_state(
        self,
        call: int,
        state: str,
        timeout: float | None = None,
        alive: Callable[[], set[int]] | None = None,
    ) -> list[str]:
        """Every rank's ``state`` of its ``call``-th state_dict() (JSON text), by rank, through
        the launcher's store: each rank writes its own and waits up to ``timeout`` (default
        ``STATE_SECONDS``) for the others'. ConfigError naming the ranks that did not call,
        with the fix, rather than a hang. ``alive``: the ranks rank 0's master hears from,
        asked every second while some are awaited; one awaited that was alive before (it
        took part in the last call, or an earlier look saw it) and is no longer died: a
        MasterError says so at once, and the launcher restarts the job from its last saved
        state. (A rank not seen yet may still be starting: it is waited for.)
        Keys live under the master's nonce, so a restarted round never reads an earlier
        round's states; each rank removes its key of two calls back, which every rank has
        read by the time any rank makes this call."""
        if self.nonce is None:
            raise MasterError(f"rank {self.rank}: state_dict() before the dataset started")
        wait = seconds_from_env(STATE_ENV, STATE_SECONDS) if timeout is None else timeout
        keys = [self._state_key(call, r) for r in range(self.world_size)]
        if self._sharing is None:
            self._sharing = self._store()
        store = self._sharing
        with self._store_errors():
            store.set(keys[self.rank], state)
            if call >= 2:
                store.delete_key(self._state_key(call - 2, self.rank))
        return self._wait_for_states(store, keys, call, wait, alive)

    def _wait_for_states(
        self,
        store: Store,
        keys: list[str],
        call: int,
        wait: float,
        alive: Callable[[], set[int]] | None,
    ) -> list[str]:
        """Every rank's state of ``call`` (``keys``), once each is in the store; MasterError
        as soon as an awaited rank is seen dead, ConfigError after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        next_look = time.monotonic() + 1.0
        pause = 0.001
        # Polled with check(), not wait(): a wait() that times out is logged by torch as a
        # warning, once a second of every slow step.
        while True:
            with self._store_errors():
                if store.check(keys):
                    return self._read_states(store, keys)
            now = time.monotonic()
            if now < next_look:
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            next_look = now + 1.0
            with self._store_errors():
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
            if not missing:  # the last one came just now
                return self._read_states(store, keys)
            dead = self._dead(store, call, missing, alive)
            if dead:
                raise MasterError(
                    f"rank {self.rank}: ranks {dead} of {self.world_size} stopped (rank 0's "
                    "master no longer hears from them) while the job's state was taken: "
                    "this step's state is not saved. The launcher restarts the job "
                    "(torchrun --max-restarts), which resumes from the last state saved"
                )
            if now < deadline:
                continue
            raise ConfigError(
                f"rank {self.rank}: state_dict() gathers the whole job's state, and ranks "
                f"{missing} of {self.world_size} did not call it (call {call + 1} of this "
                f"dataset) within {wait:.0f} s. Call loader.state_dict() on every rank at "
                "the same step and save it from rank 0 (any rank's is the whole job's); "
                "to save each rank's own state, call rank_state_dict() and load "
                "shmloader.merge_states(every rank's state). $SHMLOADER_STATE_SECONDS sets "
                "how long a rank waits for the others"
            )

    def _dead(
        self,
        store: Store,
        call: int,
        missing: list[int],
        alive: Callable[[], set[int]] | None,
    ) -> list[int]:
        """Of the ``missing`` ranks, those that were alive and are no longer."""
        if alive is None:
            return []
        now = alive()
        self.seen_alive |= now
        with self._store_errors():
            before = {
                r for r in missing if call > 0 and store.check([self._state_key(call - 1, r)])
            }
        return [r for r in missing if r not in now and (r in before or r in self.seen_alive)]

    def _read_states(self, store: Store, keys: list[str]) -> list[str]:
        with self._store_errors():
            return [bytes(store.get(key)).decode() for key in keys]

    def _state_key(self, call: int, rank: int) -> str:
        return f"{self.key}/{self.nonce}/state/{call}/{rank}"

    def mark_closed(self) -> None:
        """Ranks but 0, closing a dataset that used rank 0's master: rank 0 may stop it."""
        if self.nonce is not None and not self.hosts_master:
            with self._store_errors():
                self._store().set(self._closed_key(self.rank), "1")

    def wait_for_ranks(self, timeout: float | None = None) -> list[int]:
        """Rank 0, closing: wait until every other rank closed its dataset; returns those that
        had not after ``timeout`` (default ``CLOSE_SECONDS``; then the master stops anyway).
        Removes the key."""
        if self.nonce is None or self.world_size == 1:
            return []
        with self._store_errors():
            return self._wait_for_ranks(
                self._store(), CLOSE_SECONDS if timeout is None else timeout
            )

    def _wait_for_ranks(self, store: Store, timeout: float) -> list[int]:
        keys = [self._closed_key(r) for r in range(1, self.world_size)]
        deadline = time.monotonic() + timeout
        next_log = time.monotonic() + LOG_EVERY
        while not store.check(keys):
            now = time.monotonic()
            if now >= deadline or now >= next_log:
                waiting = [r for r, k in enumerate(keys, 1) if not store.check([k])]
                if now >= deadline:
                    store.delete_key(self.key)
                    return waiting
                log.info("rank 0 keeps its master up until ranks %s close their datasets", waiting)
                next_log = now + LOG_EVERY
            time.sleep(0.05)
        store.delete_key(self.key)
        return []

    @contextlib.contextmanager
    def _store_errors(self) -> Iterator[None]:
        """torch's store errors (RuntimeError) as MasterError, naming the store."""
        try:
            yield
        except RuntimeError as exc:
            raise MasterError(
                f"rank {self.rank}: the launcher's store at {self.store_host}:{self.store_port} "
                f"failed: {exc}"
            ) from exc

    def _closed_key(self, rank: int) -> str:
        return f"{self.key}/{self.nonce}/closed/{rank}"

    def _store(self) -> Store:
        from torch.distributed import TCPStore

        try:
            return TCPStore(
                self.store_host,
                self.store_port,
                is_master=False,
                timeout=timedelta(seconds=CONNECT_SECONDS),
            )
        except RuntimeError as exc:
            raise MasterError(
                f"rank {self.rank}: cannot reach the launcher's store at "
                f"{self.store_host}:{self.store_port} (MASTER_ADDR, MASTER_PORT): {exc}. "
                "torchrun serves one there; with another launcher, call "
                "torch.distributed.init_process_group first"
            ) from exc


def _answers(address: str) -> bool:
    """Whether something accepts connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except (OSError, ValueError):
        return False


def rendezvous_from_env(
    *,
    rank: int | None,
    world_size: int | None,
    master_host: str | None,
    environ: Mapping[str, str] = os.environ,
) -> Rendezvous:
    """The rendezvous of this rank, from the variables the launcher set; ConfigError names
    what is missing or contradicts them."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [name for name in needed if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"master='{TORCHRUN}' needs the variables torchrun sets ({', '.join(needed)}); "
            f"missing: {', '.join(missing)}. Launch with torchrun, or give rank=, "
            "world_size= and master='host:port' of a standalone master"
        )
    try:
        env_rank, env_world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        store_port = int(environ["MASTER_PORT"])
        local_world = int(environ.get("LOCAL_WORLD_SIZE") or env_world)
    except ValueError as exc:
        raise ConfigError(
            f"master='{TORCHRUN}': a launcher variable is not a number: {exc}"
        ) from exc
    for name, given, env in (("rank", rank, env_rank), ("world_size", world_size, env_world)):
        if given is not None and given != env:
            raise ConfigError(
                f"{name}={given} contradicts the launcher's {name.upper()}={env}; with "
                f"master='{TORCHRUN}' leave {name} out (it comes from the launcher)"
            )
    if master_host is None:
        # One machine: loopback. Several (now: under torchrun --nnodes MIN:MAX a job that
        # started on one machine grows in a later round, whose rank 0 starts its own master):
        # every interface, reached where the others reach the launcher's store. It serves no
        # TLS, so a token= is refused across machines (runtime.py), and without one it is
        # said once that the master takes anyone's calls (docs/how-to/security.md).
        master_host = "127.0.0.1" if local_world >= env_world else "0.0.0.0"
    store_host = environ["MASTER_ADDR"]
    advertise = store_host if master_host in WILDCARD_HOSTS else master_host
    return Rendezvous(
        rank=env_rank,
        world_size=env_world,
        store_host=store_host,
        store_port=store_port,
        key=f"shmloader/dataset-{next(_numbers)}/master",
        bind_host=master_host,
        advertise_host=advertise,
    )
