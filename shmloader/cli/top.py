"""``shmloader stats`` and ``shmloader top``: where a running job stands, once or live.

Both ask a master (standalone, or an embedded one whose address the trainer printed) for its
progress: epochs, records done and leased, quarantined tasks, the trainers it serves and their
leases (with several trainers sharing epochs, how the work splits between them), and its
counters; and they list this machine's shared-memory stores. ``top`` redraws every
``--interval`` seconds and shows how many records per second were done over the last
``RATE_WINDOW`` seconds: records count as done when their task completes, a task's records
at once, so a rate over one short interval would jump between 0 and a task's worth. On a
terminal, lines are wrapped at its width between words. When the job's master exits after
its last epoch, ``top`` says so and ends.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import textwrap
import time
from collections import deque
from typing import Any

from ..errors import ShmloaderError
from ..master.client import MasterClient
from ..master.credentials import TLS_CA_ENV, TOKEN_ENV, Credentials
from ..master.progress import Progress
from ..shm.reap import ReapReport, reap_stale
from ..shm.sizes import format_size
from ..shm.space import BASE_DIR_ENV
from ._help import plain
from ._progress_text import counter_line, epoch_lines

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen
RATE_WINDOW = 10.0  # seconds the rate of records done is taken over (at least two frames)


def register(subparsers: Any) -> None:
    stats = _parser(
        subparsers,
        "stats",
        "print where a job stands (a master's progress, this machine's shared memory)",
    )
    stats.add_argument("--json", action="store_true", help="the master's progress as JSON")
    stats.set_defaults(func=run_stats)
    top = _parser(
        subparsers, "top", "watch a job live (what stats prints, redrawn, with records per second)"
    )
    top.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    top.add_argument("--count", type=int, default=0, help="stop after N frames (0: Ctrl-C)")
    top.set_defaults(func=run_top)


def _parser(subparsers: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A sub-command's parser with the options both commands share."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("master", metavar="HOST:PORT", help="the master's address")
    parser.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV})")
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        default=None,
        help=f"CA certificate to check the master's TLS against (default: ${TLS_CA_ENV})",
    )
    parser.add_argument(
        "--base",
        metavar="DIR",
        default=None,
        help=f"base directory of the stores (default: ${BASE_DIR_ENV} or /dev/shm)",
    )
    return parser


def _client(args: argparse.Namespace) -> MasterClient:
    credentials = Credentials.resolve(args.token, args.tls_ca)
    # A watcher must not hang on a master that is gone: fail within seconds, say why.
    return MasterClient(
        args.master,
        token=credentials.token,
        root_certificates=credentials.tls_ca,
        timeout=5,
        retry_for=2,
    )


def run_stats(args: argparse.Namespace) -> int:
    try:
        with _client(args) as client:
            progress = client.progress()
    except (ShmloaderError, OSError) as exc:
        print(f"shmloader stats: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(dataclasses.asdict(progress), indent=1, sort_keys=True))
    else:
        stores = reap_stale(args.base, dry_run=True)
        print(render(args.master, progress, time.time(), stores=stores))
    return 0


def run_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("shmloader top: --interval must be > 0", file=sys.stderr)
        return 2
    live = sys.stdout.isatty()
    try:
        client = _client(args)
    except (ShmloaderError, OSError) as exc:
        print(f"shmloader top: {exc}", file=sys.stderr)
        return 1
    with client:
        seen: deque[tuple[float, int]] = deque()  # (time, records done) of recent frames
        last: Progress | None = None
        frame = 0
        try:
            while True:
                now = time.time()
                try:
                    progress = client.progress()
                except ShmloaderError as exc:
                    if last is None:  # never reached: nothing to watch
                        print(f"shmloader top: {exc}", file=sys.stderr)
                        return 1
                    if last.finished:  # the job ended, and its master with it
                        print(f"shmloader top: the job at {args.master} finished, and its "
                              "master has exited", flush=True)  # fmt: skip
                        return 0
                    text = f"shmloader top: {exc}"  # it names the master
                else:
                    last = progress
                    rate = records_rate(seen, now, records_done(progress))
                    stores = reap_stale(args.base, dry_run=True)
                    text = render(args.master, progress, now, rate=rate, stores=stores)
                if live:
                    text = _CLEAR + wrapped(text, shutil.get_terminal_size().columns)
                print(text, flush=True)
                frame += 1
                if args.count and frame >= args.count:
                    return 0
                if not live:
                    print()
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def records_rate(
    seen: deque[tuple[float, int]], now: float, done: int
) -> tuple[float, float] | None:
    """(records per second, over how many seconds) from the oldest frame of the last
    ``RATE_WINDOW`` seconds to this one, which ``seen`` then holds too; None for a first."""
    seen.append((now, done))
    while len(seen) > 2 and now - seen[1][0] >= RATE_WINDOW:
        seen.popleft()
    then, before = seen[0]
    span = now - then
    return None if len(seen) < 2 or span <= 0 else ((done - before) / span, span)


def wrapped(text: str, width: int) -> str:
    """Each line of ``text`` wrapped at ``width`` between words, its continuation indented
    under it: a terminal would otherwise wrap it mid-word."""
    out = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out.append(
            textwrap.fill(
                line,
                max(width, 40),
                subsequent_indent=indent,
                break_long_words=False,
                break_on_hyphens=False,
            )
            if len(line) > width
            else line
        )
    return "\n".join(out)


def records_done(p: Progress) -> int:
    """Records done in every epoch the master started (finished ones included)."""
    return sum(e.done_records for e in p.epochs)


def render(
    address: str,
    p: Progress,
    now: float,
    *,
    rate: tuple[float, float] | None = None,
    stores: ReapReport | None = None,
) -> str:
    """One frame: the job at ``address``, its trainers, and this machine's stores. ``rate``:
    (records done per second, over how many seconds)."""
    planned = "unbounded" if p.epochs_planned is None else str(p.epochs_planned)
    state = "finished" if p.finished else "running"
    speed = "" if rate is None else f"; {rate[0]:,.0f} records/s over the last {rate[1]:.0f} s"
    lines = [
        f"master {address} ({state}): {p.epochs_finished} of {planned} epoch(s) finished, "
        f"{p.num_tasks} tasks, {p.total_records:,} records per epoch{speed}",
    ]
    for e in p.epochs[-3:]:  # the open ones, and the last finished
        lines.extend(epoch_lines(e))
    if len(p.epochs) > 3:
        lines.append(f"  ({len(p.epochs) - 3} earlier epoch(s) finished)")
    lines.append(f"trainers: {len(p.consumers)}")
    for c in p.consumers:
        rank = "-" if c.rank is None else str(c.rank)
        lines.append(
            f"  {c.consumer}  rank {rank}  seen {max(now - c.last_seen, 0.0):.1f} s ago  "
            f"{len(c.leases)} lease(s), {c.leased_records:,} records"
        )
    lines.append("counters:")
    lines.append(counter_line(p))
    if stores is not None:
        lines.extend(_store_lines(stores))
    return "\n".join(lines)


def _store_lines(stores: ReapReport) -> list[str]:
    live, stale = stores.left, stores.removed
    held = format_size(sum(e.nbytes for e in live))
    lines = [f"shared memory in {stores.base_dir}: {len(live)} live store(s), {held}"]
    lines.extend(f"  {format_size(e.nbytes):>10}  {e.path}  ({e.reason})" for e in live)
    if stale:
        freed = format_size(sum(e.nbytes for e in stale))
        lines.append(
            f"  {len(stale)} left by dead processes ({freed}): `shmloader clean` removes them"
        )
    return lines
