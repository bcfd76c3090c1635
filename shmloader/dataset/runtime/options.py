"""``SharedTaskDataset``'s options as one value, each checked once, here, before anything starts.

The dataset is a face over this value: it checks the arguments by building it
(:meth:`DatasetOptions.checked`), answers its attributes from it, and starts its runtime from
it. The job's own parameters (tasks, epochs, shuffle, seed, leases, DDP) are a
:class:`~shmloader.master.config.JobConfig`, which checks them for every face alike; the rest
(readers, memory, where the master is, credentials, columns) are checked here, together with
the combinations that do not fit (``metrics_port=`` beside a standalone master, say).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from ...errors import ConfigError
from ...master.config import DEFAULT_RECORDS_PER_TASK, JobConfig, check_count
from ...master.credentials import Credentials
from ...master.task_size import data_bytes, records_per_task_for, task_bytes
from ...master.tasks import DdpPolicy
from ...shm.space import budget_bytes, nominal_budget
from ...sources.arrow import ArrowSource
from ...sources.base import Source, with_varying_lists
from ...sources.hf import HFDataset, is_hf_dataset, refuse_other_hf
from ..core.ragged_form import LISTS, Ragged, RaggedForm
from .launcher import TORCHRUN, Rendezvous, rendezvous_from_env
from .reader_scaling import auto_bounds


@dataclass(frozen=True)
class DatasetOptions:
    """What a ``SharedTaskDataset`` was asked for, checked (docs/dataset.md has every option)."""

    source: Source
    num_readers: int | Literal["auto"]  # as given
    first_readers: int  # how many readers start
    # num_readers="auto": the fewest and most readers (autoscale.py); None: a fixed count.
    reader_bounds: tuple[int, int] | None
    job: JobConfig  # as the embedded master runs it
    # records_per_task= chosen, not the default: a standalone master's must then be the same.
    records_per_task_given: bool
    shm_budget: int  # bytes
    # What tasks sized from the data aim at: shm_budget as given, or "auto" on this
    # filesystem as if empty (shm/space.py nominal_budget): steady from run to run.
    sizing_budget: int
    shuffle_window: int  # tasks shuffled together
    master: str | None  # as given: "host:port", "torchrun" or None (embedded)
    master_host: str | None  # where an embedded master listens (None: loopback)
    metrics_port: int | None  # an embedded master's /metrics (None: not served)
    rendezvous: Rendezvous | None  # master="torchrun": rank 0's master, found in torchrun's store
    credentials: Credentials  # the token, and the CA of a standalone master serving TLS
    rank: int | None
    shm_dir: str | None
    columns: tuple[str, ...] | None  # the batches' columns (None: all)
    cache: bool = False  # decoded tasks kept in the store for the next epochs
    # How batches hold variable-length list columns (gather/ragged.py); ragged_given: chosen,
    # not the default (which is said once when such a column appears).
    ragged: RaggedForm = LISTS
    ragged_given: bool = False

    @property
    def standalone_master(self) -> str | None:
        """The address of a master this job did not start (``master="host:port"``), else None."""
        return self.master if self.master is not None and self.rendezvous is None else None

    def sized_job(self) -> JobConfig:
        """``job`` with its ``records_per_task``, where not given, sized from the data
        (master/task_size.py); as it is where given, or where a standalone master plans the
        tasks (its own size then counts; the plan check at registration accepts it)."""
        if self.records_per_task_given or self.standalone_master is not None:
            return self.job
        plan = self.source.plan()
        aim = task_bytes(self.sizing_budget, self.shuffle_window)
        size = records_per_task_for(plan, data_bytes(self.source), self.job.world_size, aim)
        return dataclasses.replace(self.job, records_per_task=size)

    @property
    def ready_ahead(self) -> int:
        """Ready tasks the readers lease no further than (shm/hints.py): two windows, the
        block the sampler takes next and the one after it."""
        return 2 * self.shuffle_window

    @classmethod
    def checked(
        cls,
        source: Source | HFDataset,
        *,
        num_readers: int | Literal["auto"],
        records_per_task: int | None,
        shuffle: bool,
        seed: int,
        shm_budget: int | str,
        epochs: int | None,
        shuffle_window: int,
        master: str | None,
        master_host: str | None,
        metrics_port: int | None,
        token: str | None,
        tls_ca: str | os.PathLike[str] | None,
        rank: int | None,
        world_size: int | None,
        ddp_policy: DdpPolicy,
        lease_timeout: float,
        max_retries: int,
        shm_dir: str | None,
        columns: Sequence[str] | None,
        cache: bool = False,
        ragged: Ragged | None = None,
        pad_value: int | float = 0,
    ) -> DatasetOptions:
        """The options, or the ConfigError of the first that does not fit (the defaults are
        ``SharedTaskDataset``'s signature's)."""
        checked = _as_source(source)
        if ragged is not None:
            # The user chose how ragged columns are batched, so expects some: a 1-D column of
            # numbers is a list whatever lengths the source's sample shows (sources/base.py).
            checked = with_varying_lists(checked)
        first_readers, reader_bounds = _readers(num_readers)
        window = check_count("shuffle_window", shuffle_window, 1, "tasks shuffled together, e.g. 8")
        rendezvous = _rendezvous(master, master_host, metrics_port, rank, world_size)
        if rendezvous is not None:  # rank 0 hosts the master; rank and world size from torchrun
            rank, world_size = rendezvous.rank, rendezvous.world_size
        if not isinstance(cache, bool):
            raise ConfigError(
                f"cache must be True or False, got {cache!r}: True keeps decoded tasks in "
                "shared memory for the next epochs (decode must give the same records each "
                "epoch)"
            )
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size (DDP), or neither")
        # The job, as the embedded master runs it (JobConfig checks its fields); a standalone
        # master's own settings are checked against it at registration (plan_check.py).
        job = JobConfig(
            records_per_task=(
                DEFAULT_RECORDS_PER_TASK if records_per_task is None else records_per_task
            ),
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            lease_timeout=lease_timeout,
            # An embedded master's consumers are this job's own trainers: a dead one's taken
            # tasks come back as soon as its untaken ones.
            consumer_timeout=max(lease_timeout, 10.0),
            max_retries=max_retries,
            world_size=world_size,
            ddp_policy=ddp_policy,
        )
        return cls(
            source=checked,
            num_readers=num_readers,
            first_readers=first_readers,
            reader_bounds=reader_bounds,
            job=job,
            records_per_task_given=records_per_task is not None,
            shm_budget=budget_bytes(shm_budget, shm_dir, os.environ),
            sizing_budget=nominal_budget(shm_budget, shm_dir, os.environ),
            shuffle_window=window,
            master=master,
            master_host=master_host,
            metrics_port=metrics_port,
            rendezvous=rendezvous,
            credentials=_credentials(master, token, tls_ca),
            rank=rank,
            shm_dir=shm_dir,
            columns=None if columns is None else tuple(columns),
            cache=cache,
            ragged=RaggedForm.checked("list" if ragged is None else ragged, pad_value),
            ragged_given=ragged is not None,
        )


def _readers(num_readers: int | Literal["auto"]) -> tuple[int, tuple[int, int] | None]:
    """How many readers start, and under ``"auto"`` the fewest and most (None: a fixed
    count)."""
    if num_readers == "auto":
        # Start small; the maintenance thread adds and retires readers (autoscale.py).
        bounds = auto_bounds()
        return bounds[0], bounds
    example = 'reader processes, e.g. 2 (the default) or "auto"'
    return check_count("num_readers", num_readers, 1, example), None


def _rendezvous(
    master: str | None,
    master_host: str | None,
    metrics_port: int | None,
    rank: int | None,
    world_size: int | None,
) -> Rendezvous | None:
    """Where the master is, checked: under ``master="torchrun"`` rank 0's, found in the
    launcher's store (rank and world size from torchrun); None otherwise. Refuses the
    options that fit only an embedded master beside a standalone one."""
    if master_host is not None and not master_host.strip():
        raise ConfigError("master_host must name an interface ('0.0.0.0': all of them)")
    if master == TORCHRUN:
        return rendezvous_from_env(rank=rank, world_size=world_size, master_host=master_host)
    if master is not None and metrics_port is not None:
        raise ConfigError(
            "metrics_port= is where an embedded master serves its /metrics; with "
            "master='host:port' the standalone master serves them: start it with "
            "shmloader master ... --metrics-port PORT"
        )
    if master is not None and master_host is not None:
        raise ConfigError(
            "master_host= is where the embedded master listens; with master='host:port' "
            "there is none"
        )
    return None


def _as_source(source: Source | HFDataset) -> Source:
    """``source`` checked to be one (a ``datasets.Dataset`` becomes an :class:`ArrowSource`
    over its Arrow files, sources/hf.py)."""
    refuse_other_hf(source)
    if is_hf_dataset(source):
        return ArrowSource(source)
    lacks = [m for m in ("plan", "read_result") if not callable(getattr(source, m, None))]
    if lacks:
        raise ConfigError(
            f"source must be a shmloader source, got {type(source).__name__}, which has no "
            f"{' and no '.join(f'{m}()' for m in lacks)} (the protocol: docs/sources.md)"
        )
    return cast(Source, source)  # it has the protocol's methods


def _credentials(
    master: str | None, token: str | None, tls_ca: str | os.PathLike[str] | None
) -> Credentials:
    """What the trainer's client and its readers show the master and check it by.

    A standalone master's (``master="host:port"``) come from the arguments, else
    ``$SHMLOADER_TOKEN`` and ``$SHMLOADER_TLS_CA``, and are checked here, before anything
    starts: a token never goes in clear beyond this machine. An embedded master (also rank
    0's under torchrun) serves no TLS and requires only the token given here."""
    if master is not None and master != TORCHRUN:
        credentials = Credentials.resolve(token, tls_ca)
        credentials.check_transport(master)
        return credentials
    if tls_ca is not None:
        raise ConfigError(
            "tls_ca= checks the certificate of a standalone master (master='host:port', "
            "started with shmloader master --tls-cert FILE --tls-key FILE); the embedded "
            "master serves no TLS. Leave tls_ca out, or run a standalone master"
        )
    return Credentials(token=token)
