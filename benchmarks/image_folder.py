"""A folder of images read by torchvision's ``ImageFolder`` and by shmloader's ``FileSource``,
side by side, in one run.

Run by hand (not a test), from the repository root, with Pillow and torchvision installed
beside torch: ``python benchmarks/image_folder.py [--files N] [--classes C] [--size PX]
[--format jpg|png] [--rounds R] [--epochs E] [--batch B] [--records-per-task N]
[--only "NAME;NAME"] [--json FILE]``.

It writes ``train/<class>/<n>.jpg`` into a temporary folder (``--files`` images of
``--size`` x ``--size`` RGB in ``--classes`` class folders; smooth colour waves plus noise,
JPEG quality 90, or PNG with ``--format png``), reads every file once (into the page cache,
for every configuration alike), then runs each configuration in a fresh process, round after
round:

* ``ImageFolder, 2 workers``: ``torchvision.datasets.ImageFolder(root, transform=to_chw)``
  (Pillow opens and decodes the file, ``to_chw`` makes a uint8 CHW tensor of it; no
  augmentation) in ``torch.utils.data.DataLoader(batch_size=--batch, shuffle=True,
  num_workers=2)`` (``--batch`` 64 by default);
* ``ImageFolder, no workers``: the same with ``num_workers=0``;
* ``FileSource, 2 readers``: ``shmloader.FileSource(root, decode=decode)`` (the same Pillow
  decode of the file's bytes into a uint8 CHW array, the label from the folder's name) in
  ``SharedTaskDataset(source, num_readers=2)`` (tasks sized from the files, or
  ``--records-per-task``) through ``shmloader.DataLoader(ds, batch_size=--batch)``: two
  reader processes, as many as the two workers.

Each run imports torch, then times the library's own import (torchvision or shmloader), and
from the end of that import: the first batch (the dataset made, the folder listed, workers or
readers started, the first batch in the loop); samples/s of epoch 1 (from its first batch,
without that batch's rows) and of the epochs after it (each from the end of the one before,
worker or reader start included), over ``--epochs`` whole epochs; and the CPU time per image
of the epochs after the first, summed over the process and every process under it (workers,
readers, the readers' fork server; ``psutil``, in the ``bench`` extra). Every epoch of every
run is checked to deliver each image exactly once (the ids of all its rows, sorted, are
0..N-1) with the label of its folder, and its first batch to hold 3 x SIZE x SIZE images.
The table gives medians of the rounds and the samples/s against the better of the two
``ImageFolder`` configurations'.

The torchvision wheel on PyPI for Linux is built against the CUDA build of torch; beside
torch's CPU build its C++ operators (``nms``, ``roi_align``, ...) do not load and
``import torchvision`` fails registering them. ``ImageFolder`` uses none of them: where that
import fails so, each run declares the two operators' signatures that the import looks up
(before the clock) and says so in the output.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.utils.data

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _bench_child import run_script_child  # noqa: E402

CONFIGS = ("ImageFolder, 2 workers", "ImageFolder, no workers", "FileSource, 2 readers")
TORCH = CONFIGS[:2]
FIELDS = ("import_s", "first_batch_s", "epoch1_samples_s", "later_samples_s", "later_cpu_us")


# -- the images ---------------------------------------------------------------------------


def class_names(classes: int) -> list[str]:
    return [f"class{c:02d}" for c in range(classes)]


def write_images(root: str, files: int, classes: int, size: int, fmt: str) -> None:
    """``root/<class>/<n>.<fmt>``, ``n`` numbered across the classes in class order (so
    ``ImageFolder``'s index of a file is its ``n``), ``files // classes`` per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    per_class = files // classes
    for c, name in enumerate(class_names(classes)):
        os.makedirs(os.path.join(root, name))
        for n in range(c * per_class, (c + 1) * per_class):
            fx, fy, phase = rng.uniform(2, 12, 3), rng.uniform(2, 12, 3), rng.uniform(0, 6, 3)
            waves = np.sin(x[..., None] / fx + y[..., None] / fy + phase) * 60 + 128
            noise = rng.normal(0, 16, (size, size, 3))
            pixels = np.clip(waves + noise, 0, 255).astype(np.uint8)
            path = os.path.join(root, name, f"{n:06d}.{fmt}")
            if fmt == "jpg":
                Image.fromarray(pixels).save(path, format="JPEG", quality=90)
            else:
                Image.fromarray(pixels).save(path, format="PNG")


def all_files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def read_once(paths: Iterable[str]) -> int:
    """Every file read once (into the page cache); their bytes."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    return total


# -- the decoding, the same on both sides -------------------------------------------------


def to_chw(image: Any) -> torch.Tensor:
    """``ImageFolder``'s transform: a decoded RGB Pillow image -> uint8 tensor C x H x W."""
    return torch.from_numpy(np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1)))


def decode(data: bytes, path: str, classes: tuple[str, ...]) -> dict[str, Any]:
    """``FileSource``'s decode, in the readers: the file's bytes -> the uint8 C x H x W image
    (as ``ImageFolder``'s loader opens it: Pillow, ``convert("RGB")``), the label from the
    folder's name, and the id from the file's name."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    return {
        "image": np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1)),
        "label": classes.index(os.path.basename(os.path.dirname(path))),
        "id": int(os.path.basename(path).partition(".")[0]),
    }


class WithIndex(torch.utils.data.Dataset[tuple[torch.Tensor, int, int]]):
    """A map-style dataset's samples with their index: ``(image, label, index)``. For
    ``ImageFolder`` the index is the file's number (files sorted by class, then name)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, label = self.inner[index]
        return image, label, index


# -- torchvision beside torch's CPU build -------------------------------------------------


def torchvision_imports() -> bool:
    """Whether ``import torchvision`` works as it is, tried in a process of its own."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", "import torchvision"], capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return True
    if "operator torchvision::nms does not exist" not in done.stderr:
        raise SystemExit(f"import torchvision failed:\n{done.stderr}")
    return False


def declare_torchvision_operators() -> None:
    """The signatures of the two operators ``import torchvision`` registers fake kernels for
    without checking that its C++ library loaded (``torchvision/_meta_registrations.py``);
    no kernel: nothing here calls them."""
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    declare_torchvision_operators.library = library  # type: ignore[attr-defined]  # kept alive


# -- one configuration, in a fresh process ------------------------------------------------

Batches = Callable[[], Iterable[tuple[Any, Any, Any]]]  # one epoch: (images, labels, ids)


def image_folder_loader(spec: dict[str, Any]) -> Batches:
    import torchvision

    dataset = WithIndex(torchvision.datasets.ImageFolder(spec["root"], transform=to_chw))
    generator = torch.Generator()
    generator.manual_seed(spec["seed"])
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=spec["batch"],
        shuffle=True,
        num_workers=spec["workers"],
        generator=generator,
    )
    return lambda: loader


def file_source_loader(spec: dict[str, Any]) -> tuple[Batches, Any]:
    import shmloader

    classes = tuple(class_names(spec["classes"]))
    source = shmloader.FileSource(spec["root"], decode=partial(decode, classes=classes))
    sized = {"records_per_task": spec["records_per_task"]} if spec["records_per_task"] else {}
    dataset = shmloader.SharedTaskDataset(source, num_readers=2, seed=spec["seed"], **sized)
    loader = shmloader.DataLoader(dataset, batch_size=spec["batch"])

    def batches() -> Iterable[tuple[Any, Any, Any]]:
        return ((b["image"], b["label"], b["id"]) for b in loader)

    return batches, dataset


def tree_cpu() -> float:
    """CPU seconds (user + system) so far of this process and every process under it: the
    live ones (with the children they waited for) and those this one waited for."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # gone since the listing: its parent's children_* hold it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration, measured in this (fresh) process."""
    if spec["declare_operators"]:
        declare_torchvision_operators()
    began = time.perf_counter()
    closing = None
    if spec["name"].startswith("ImageFolder"):
        import torchvision  # noqa: F401

        imported = time.perf_counter()
        batches = image_folder_loader(spec)
    else:
        import shmloader  # noqa: F401

        imported = time.perf_counter()
        batches, closing = file_source_loader(spec)
    files, per_class = spec["files"], spec["files"] // spec["classes"]
    first_batch = cpu_later = 0.0
    epochs: list[tuple[int, float]] = []  # (rows timed, seconds) of each epoch
    try:
        for epoch in range(spec["epochs"]):
            if epoch == 1:
                cpu_later = tree_cpu()
            ids, labels = [], []
            rows = untimed = 0
            epoch_began = time.perf_counter()
            for images, label, index in batches():
                now = time.perf_counter()
                if not first_batch:
                    first_batch = now - imported
                    epoch_began, untimed = now, len(label)
                    shape = (3, spec["size"], spec["size"])
                    assert tuple(images.shape[1:]) == shape, (spec["name"], images.shape)
                rows += len(label)
                ids.append(index)
                labels.append(label)
            epochs.append((rows - untimed, time.perf_counter() - epoch_began))
            # Every image once, with the label of its folder (outside the epochs' time).
            got, got_labels = torch.cat(ids).numpy(), torch.cat(labels).numpy()
            order = np.argsort(got)
            assert rows == files, (spec["name"], rows, files)
            assert np.array_equal(got[order], np.arange(files)), spec["name"]
            assert np.array_equal(got_labels[order], np.arange(files) // per_class), spec["name"]
        cpu_later = tree_cpu() - cpu_later
    finally:
        if closing is not None:
            closing.close()
    later_rows = sum(rows for rows, _ in epochs[1:])
    return {
        "import_s": imported - began,
        "first_batch_s": first_batch,
        "epoch1_samples_s": epochs[0][0] / epochs[0][1],
        "later_samples_s": later_rows / sum(s for _, s in epochs[1:]),
        "later_cpu_us": 1e6 * cpu_later / later_rows,
        "epochs_checked": len(epochs),
        "records_per_task": closing.records_per_task if closing is not None else None,
    }


# -- the run -------------------------------------------------------------------------------


def decode_alone(paths: list[str], classes: tuple[str, ...]) -> float:
    """Microseconds per image of ``decode`` in this one process, files' bytes in memory (best
    of 3 passes)."""
    data = []
    for path in paths:
        with open(path, "rb") as f:
            data.append((f.read(), path))
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for payload, path in data:
            decode(payload, path, classes)
        best = min(best, time.perf_counter() - began)
    return 1e6 * best / len(paths)


def machine() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} CPUs, load average {load}"


def versions() -> str:
    import PIL
    import torch

    import shmloader

    try:
        from importlib.metadata import version

        vision = version("torchvision")
    except Exception:  # not installed: said so
        vision = "not installed"
    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, torchvision {vision}, "
        f"Pillow {PIL.__version__}, numpy {np.__version__}, shmloader {shmloader.__version__}"
    )


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Medians of the rounds, and each figure against the better ``ImageFolder``
    configuration's (samples/s: higher is better; seconds: lower)."""
    med = {
        n: {f: statistics.median(r[f] for r in runs) for f in FIELDS} for n, runs in results.items()
    }
    lower = ("import_s", "first_batch_s", "later_cpu_us")
    best = {
        f: (min if f in lower else max)(med[n][f] for n in TORCH if n in med)
        for f in FIELDS
        if any(n in med for n in TORCH)
    }
    lines = [
        "| configuration | import | first batch | epoch 1 | epochs >= 2 "
        "| CPU per image, epochs >= 2 | epoch 1 / best ImageFolder "
        "| epochs >= 2 / best ImageFolder |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, m in med.items():
        ratios = (
            [f"{m[f] / best[f]:.2f}" for f in ("epoch1_samples_s", "later_samples_s")]
            if best
            else ["", ""]
        )
        lines.append(
            f"| {name} | {m['import_s']:.2f} s | {m['first_batch_s']:.2f} s "
            f"| {m['epoch1_samples_s']:,.0f}/s | {m['later_samples_s']:,.0f}/s "
            f"| {m['later_cpu_us']:.0f} us | {' | '.join(ratios)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--size", type=int, default=64, help="images of SIZE x SIZE RGB")
    parser.add_argument("--format", choices=("jpg", "png"), default="jpg")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="per run, at least 2")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--records-per-task",
        type=int,
        help="FileSource's records_per_task (default: SharedTaskDataset's, sized from the files)",
    )
    parser.add_argument("--only", help="configurations separated by ';' (default: all)")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.files % args.classes:
        raise SystemExit("--files: a multiple of --classes")
    if args.epochs < 2:
        raise SystemExit("--epochs: at least 2 (epoch 1 and the epochs after it apart)")
    names = [n.strip() for n in args.only.split(";")] if args.only else list(CONFIGS)
    if not set(names) <= set(CONFIGS):
        raise SystemExit(f"--only: configurations are {'; '.join(CONFIGS)}")
    declare = not torchvision_imports()
    print(machine())
    print(versions())
    if declare:
        print(
            "import torchvision fails on its C++ operators (built for torch's CUDA build); "
            "each run declares the two it looks up first (ImageFolder uses none)"
        )
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        root = os.path.join(folder, "train")
        t0 = time.perf_counter()
        write_images(root, args.files, args.classes, args.size, args.format)
        paths = all_files(root)
        size = read_once(paths)
        print(
            f"wrote {len(paths):,} {args.format.upper()} files of {args.size}x{args.size} RGB "
            f"in {args.classes} folders, {size / len(paths) / 1024:.1f} KiB each on average, "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        classes = tuple(class_names(args.classes))
        print(f"decode alone, one process: {decode_alone(paths, classes):.0f} us per image")
        for r in range(args.rounds):
            for name in names:
                spec = {
                    "name": name,
                    "root": root,
                    "files": args.files,
                    "classes": args.classes,
                    "size": args.size,
                    "batch": args.batch,
                    "epochs": args.epochs,
                    "seed": r,
                    "workers": 2 if name == CONFIGS[0] else 0,
                    "declare_operators": declare,
                    "records_per_task": args.records_per_task,
                }
                done = run_script_child(__file__, spec)
                if done.returncode != 0:
                    raise SystemExit(f"{name}:\n{done.stdout}{done.stderr}")
                run = json.loads(done.stdout.strip().splitlines()[-1])
                results[name].append(run)
                tasks = f" (tasks of {run['records_per_task']})" if run["records_per_task"] else ""
                print(
                    f"  round {r + 1} {name}{tasks}: import {run['import_s']:.2f} s, "
                    f"first batch {run['first_batch_s']:.2f} s, "
                    f"epoch 1 {run['epoch1_samples_s']:,.0f}/s, "
                    f"epochs >= 2 {run['later_samples_s']:,.0f}/s, "
                    f"CPU {run['later_cpu_us']:.0f} us per image, "
                    f"{run['epochs_checked']} epochs each image once"
                )
    print(
        f"\n{args.files:,} images, batch {args.batch}, {args.epochs} epochs a run, "
        f"medians of {args.rounds} rounds (wall {time.perf_counter() - started:.0f} s; "
        f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}):\n"
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
