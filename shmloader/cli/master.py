"""``shmloader master``: serve one job's tasks to trainers on many nodes.

Plans the dataset (the format is chosen from the file names), serves until SIGINT or SIGTERM,
then stops gracefully and prints where the job stands. The first line printed is
``shmloader master listening on HOST:PORT``, flushed at once, so scripts can wait for it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType
from typing import Any

from ..errors import ConfigError, ShmloaderError
from ..master.config import JobConfig
from ..master.credentials import TOKEN_ENV, from_env
from ..master.progress import Progress
from ..master.server import LOOPBACK_HOSTS, Master
from ..master.tasks import DDP_POLICIES
from ..sources.factory import source_for_paths
from ._progress_text import counter_line, epoch_lines, epochs_to_show


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "master",
        help="serve a dataset's tasks over gRPC to trainers on other nodes",
        description=(
            "Plan SOURCE (files, globs or a Hugging Face save_to_disk folder; the format comes "
            "from the extension) and lease its tasks to consumers until SIGINT/SIGTERM. "
            "With --journal the state survives a crash: restart with the same arguments."
        ),
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="data files, globs or folders")
    p.add_argument("--records-per-task", type=int, required=True, metavar="N")
    p.add_argument(
        "--epochs",
        type=int,
        default=JobConfig.epochs or 0,
        metavar="E",
        help=f"0: unbounded (default {JobConfig.epochs or 0})",
    )
    p.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="seeded shuffle of the task order per epoch (default: on)",
    )
    p.add_argument("--seed", type=int, default=JobConfig.seed)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0: any free port (default)")
    p.add_argument("--journal", metavar="DIR", help="write-ahead journal directory (local disk)")
    p.add_argument("--fsync", choices=("always", "batch", "never"), default="batch")
    p.add_argument("--token", help=f"shared secret clients must send (default: ${TOKEN_ENV})")
    p.add_argument("--tls-cert", metavar="FILE", help="certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="private key (PEM)")
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics of the whole job at http://HOST:P/metrics (0: any "
        "port; https:// with --tls-cert, the same certificate); with a token, only to "
        "requests with 'Authorization: Bearer TOKEN'",
    )
    p.add_argument("--world-size", type=int, metavar="N", help="DDP: equal shares for N ranks")
    p.add_argument("--ddp-policy", choices=DDP_POLICIES, default=JobConfig.ddp_policy)
    p.add_argument("--lease-timeout", type=float, default=JobConfig.lease_timeout, metavar="S")
    p.add_argument(
        "--consumer-timeout", type=float, default=JobConfig.consumer_timeout, metavar="S"
    )
    p.add_argument("--max-retries", type=int, default=JobConfig.max_retries)
    p.add_argument(
        "--resume",
        metavar="STATE.json",
        help="start at a checkpoint: a (merged) loader state saved as JSON "
        "(json.dump(shmloader.merge_states(states), f))",
    )
    p.set_defaults(func=run)


def _resume_from(path: str) -> tuple[int, dict[int, list[tuple[int, int]]]]:
    """(first epoch, consumed ranges) of a loader state file; ConfigError naming what is off."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        epoch = int(state["epoch"])
        consumed = {
            int(task): [(int(a), int(b)) for a, b in ranges]
            for task, ranges in state.get("consumed", {}).items()
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a shmloader loader state: {exc}") from exc
    return epoch, consumed


def run(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        print("shmloader master: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return 2
    if args.epochs < 0:
        print("shmloader master: --epochs must be >= 0 (0: unbounded)", file=sys.stderr)
        return 2
    token = from_env(args.token, TOKEN_ENV)
    try:
        tls = None
        first_epoch, resume = _resume_from(args.resume) if args.resume else (0, None)
        if args.tls_cert is not None:
            with open(args.tls_key, "rb") as key, open(args.tls_cert, "rb") as cert:
                tls = (key.read(), cert.read())
        master = Master(
            source_for_paths(args.sources),
            records_per_task=args.records_per_task,
            epochs=args.epochs or None,
            shuffle=args.shuffle,
            seed=args.seed,
            world_size=args.world_size,
            ddp_policy=args.ddp_policy,
            lease_timeout=args.lease_timeout,
            consumer_timeout=args.consumer_timeout,
            max_retries=args.max_retries,
            journal=args.journal,
            fsync=args.fsync,
            host=args.host,
            port=args.port,
            token=token,
            tls=tls,
            metrics_port=args.metrics_port,
            first_epoch=first_epoch,
            resume=resume,
        )
        master.start()
    except (ShmloaderError, OSError) as exc:
        print(f"shmloader master: {exc}", file=sys.stderr)
        return 1
    if args.host not in LOOPBACK_HOSTS and (token is None or tls is None):
        missing = " and ".join(w for w, v in (("--token", token), ("TLS", tls)) if v is None)
        print(
            f"shmloader master: warning: listening beyond loopback without {missing}",
            file=sys.stderr,
        )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"shmloader master listening on {master.address}", flush=True)
        if master.metrics_url is not None:
            print(f"shmloader master metrics at {master.metrics_url}", flush=True)
        # A short wait, not one long one: the kernel may deliver SIGINT to one of gRPC's
        # threads, which does not interrupt the main thread's wait, and Python runs the
        # handler only when the main thread next executes bytecode.
        while not stop.wait(0.25):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        master.stop()
    print(summary(master.progress()), flush=True)
    return 0


def summary(p: Progress) -> str:
    """Final words: epochs, records done and lost, and the counters."""
    planned = "unbounded" if p.epochs_planned is None else str(p.epochs_planned)
    lines = [
        f"stopped: {p.epochs_finished} of {planned} epoch(s) finished, {p.num_tasks} tasks, "
        f"{p.total_records} records per epoch"
    ]
    shown = epochs_to_show(p.epochs)
    for e in shown:
        lines.extend(epoch_lines(e))
    if len(shown) < len(p.epochs):
        lines.append(
            f"  ({len(p.epochs) - len(shown)} more finished epoch(s), every record of each done)"
        )
    lines.append(counter_line(p))
    return "\n".join(lines)
