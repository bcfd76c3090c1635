"""The master's ``/metrics``: the whole job in Prometheus's text format, for every consumer.

Served with ``prometheus_client`` (the standard library for it) on a port of its own:
``shmloader master ... --metrics-port P``, ``Master(..., metrics_port=P)`` or
``SharedTaskDataset(..., metrics_port=P)`` for an embedded master. Each scrape reads the
dispatcher's progress and the last figures each trainer's heartbeat carried
(``TrainerFigures``), under the service's lock; nothing is kept between scrapes, so the
figures are those of the moment.

Names follow Prometheus's conventions: the ``shmloader_`` prefix, ``_total`` for counters,
base units (bytes, seconds). The job's own (tasks, leases, epochs) have no labels but
``state`` and ``epoch``; a trainer's carry ``consumer`` (and ``role`` for memory).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .figures import TrainerFigures
from .progress import Progress
from .service import MasterService

# Dispatcher counter -> (metric name, help).
_LEASE_COUNTERS = {
    "granted": ("shmloader_leases_granted_total", "Leases the master granted."),
    "completed": ("shmloader_leases_completed_total", "Leases completed: their task is done."),
    "late_completed": (
        "shmloader_leases_completed_late_total",
        "Leases completed after they lapsed (their task was done once all the same).",
    ),
    "failed": (
        "shmloader_leases_failed_total",
        "Leases whose reader reported a failure; the task is retried or quarantined.",
    ),
    "expired": (
        "shmloader_leases_expired_total",
        "Leases that lapsed (nobody renewed them for lease_timeout); the task is retried.",
    ),
    "released": (
        "shmloader_leases_released_total",
        "Leases given back unread (a consumer left, or handed its tasks back).",
    ),
}

# TrainerFigures field -> (metric name, help, counter?).
_TRAINER = {
    "records_consumed": (
        "shmloader_records_delivered_total",
        "Rows the consumer's training loop consumed.",
        True,
    ),
    "bytes_consumed": (
        "shmloader_bytes_delivered_total",
        "Bytes of shared memory the rows the consumer's loop consumed took.",
        True,
    ),
    "bytes_read": (
        "shmloader_bytes_read_total",
        "Bytes the consumer's readers wrote into shared memory.",
        True,
    ),
    "records_skipped": (
        "shmloader_records_skipped_total",
        "Records the source left out of the consumer's completed tasks (on_error='skip').",
        True,
    ),
    "batches": (
        "shmloader_batches_total",
        "Batches the consumer's loop received (shmloader.DataLoader).",
        True,
    ),
    "loop_seconds": (
        "shmloader_loop_seconds_total",
        "Seconds of the consumer's training steps, waits included (shmloader.DataLoader).",
        True,
    ),
    "loop_wait_seconds": (
        "shmloader_data_wait_seconds_total",
        "Seconds the consumer's loop waited for batches (shmloader.DataLoader).",
        True,
    ),
    "reader_wait_seconds": (
        "shmloader_reader_wait_seconds_total",
        "Seconds the consumer's sampler waited for tasks its readers had not made ready.",
        True,
    ),
    "shm_in_use_bytes": (
        "shmloader_shm_in_use_bytes",
        "Bytes of segments in the consumer's shared-memory store.",
        False,
    ),
    "shm_budget_bytes": (
        "shmloader_shm_budget_bytes",
        "The most bytes of segments the consumer's store may hold.",
        False,
    ),
    "readers": ("shmloader_readers", "Reader processes the consumer runs.", False),
}


class JobCollector(Collector):
    """Reads one master's service at each scrape."""

    def __init__(self, service: MasterService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        with service.lock:
            progress = service.dispatcher.progress()
            figures = dict(service.figures)
        yield from self._job(progress)
        yield from self._trainers(figures, {c.consumer for c in progress.consumers})

    def _job(self, progress: Progress) -> Iterator[Metric]:
        started = CounterMetricFamily(
            "shmloader_epochs_started", "Epochs the master opened.", value=progress.epochs_started
        )
        finished = CounterMetricFamily(
            "shmloader_epochs_finished",
            "Epochs the master finished.",
            value=progress.epochs_finished,
        )
        yield started
        yield finished
        yield GaugeMetricFamily(
            "shmloader_epoch_records",
            "Records one epoch schedules (the plan's, before DDP padding).",
            value=progress.total_records,
        )
        tasks = GaugeMetricFamily(
            "shmloader_tasks",
            "Tasks (DDP: task pieces) of the open epochs, by state.",
            labels=["epoch", "state"],
        )
        records = GaugeMetricFamily(
            "shmloader_records",
            "Records of the open epochs, by state.",
            labels=["epoch", "state"],
        )
        quarantined = 0
        for e in progress.epochs:
            quarantined += e.quarantined_units
            if e.finished:
                continue
            for state in ("todo", "leased", "done", "quarantined"):
                tasks.add_metric([str(e.epoch), state], getattr(e, f"{state}_units"))
                records.add_metric([str(e.epoch), state], getattr(e, f"{state}_records"))
        yield tasks
        yield records
        yield CounterMetricFamily(
            "shmloader_tasks_quarantined",
            "Tasks that failed on every try, over all epochs (their records are listed by "
            "shmloader stats).",
            value=quarantined,
        )
        for key, (name, help_text) in _LEASE_COUNTERS.items():
            yield CounterMetricFamily(
                name.removesuffix("_total"), help_text, value=progress.counters.get(key, 0)
            )
        yield GaugeMetricFamily(
            "shmloader_consumers",
            "Consumers (trainers) registered at the master now.",
            value=len(progress.consumers),
        )

    def _trainers(
        self, figures: dict[str, TrainerFigures], registered: set[str]
    ) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, (name, help_text, counter) in _TRAINER.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            base = name.removesuffix("_total") if counter else name
            families[key] = kind(base, help_text, labels=["consumer"])
        pss = GaugeMetricFamily(
            "shmloader_memory_pss_bytes",
            "PSS of the consumer's processes, by role (trainer, worker, reader).",
            labels=["consumer", "role"],
        )
        for consumer, f in figures.items():
            for key, family in families.items():
                value = getattr(f, key)
                if not _TRAINER[key][2] and consumer not in registered:
                    continue  # a gauge of a consumer that left says nothing of now
                family.add_metric([consumer], value)
            if consumer in registered:
                for role, nbytes in sorted(f.pss_bytes.items()):
                    pss.add_metric([consumer, role], nbytes)
        yield from families.values()
        yield pss


@dataclass
class MetricsServer:
    """``/metrics`` of one master, served over HTTP from a thread of its own."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(service: MasterService, host: str, port: int) -> MetricsServer:
    """Serve ``service``'s job at ``http://host:port/metrics`` (port 0: any free one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(service))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
