"""Loaders around the loader: what a wrapper that iterates a batch sampler's DataLoader adds.

torch's requests tell which batches torch handed to whoever iterates its DataLoader
(delivery.py). A wrapper between torch and the training loop can hold batches back:
accelerate's prepared DataLoader (``Accelerator.prepare``: a ``DataLoaderShard``) takes the
next batch from torch before it yields the current one, to know which batch is the last. The
loop then has one batch fewer than torch handed over, and a ``break`` or a checkpoint would
count the one held back. :func:`wrapper_of` finds such a wrapper where it says so itself
(accelerate's ``GradientState.active_dataloader`` is the prepared loader being iterated), so
that the batch sampler counts receipts one batch later, and the last one once the wrapper says
the loop has it: its ``end_of_dataloader`` is set as it yields the last batch, and its
``iteration`` counts the passes it ran to their end. torch's requests cannot tell the last
batch of a pass with workers: torch asks for the next batch as it returns one, and accelerate
holds the last one back until its loop asks past it, after torch's last request.

Wrappers that would hand batches out and drop them are refused, with the fix: accelerate's
sharding across processes (``BatchSamplerShard``: every process keeps one batch in
``num_processes``, but a dataset under DDP already reads only its rank's share) and
``skip_first_batches`` (the dataset resumes from its own state, without drawing batches).
Nothing is imported: accelerate is looked for only where the script imported it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ...errors import ConfigError

if TYPE_CHECKING:
    import torch.utils.data

RESHARDED = (
    "accelerate's prepare() shards this DataLoader's batches across its {n} processes "
    "(every process keeps one batch in {n} and draws the others for nothing), but "
    "SharedTaskDataset already gives each process its own share (rank= and world_size=, or "
    "master='torchrun'): prepare the model and optimizer only, and iterate the "
    "shmloader.DataLoader itself (move batches with transform=lambda b: "
    "accelerate.utils.send_to_device(b, accelerator.device))"
)
SKIPPED = (
    "accelerate's skip_first_batches() would draw {n} batches of this dataset and drop "
    "them; SharedTaskDataset resumes where its state says, without skipping: register it "
    "(accelerator.register_for_checkpointing(ds)) and iterate the loader as it is"
)


class EndOfLoader(Protocol):
    """A wrapper that says when its iteration reached the last batch (``end_of_dataloader``,
    until its next pass begins) and how many passes it ran to their end (``iteration``)."""

    @property
    def end_of_dataloader(self) -> bool: ...

    @property
    def iteration(self) -> int: ...


@dataclass(frozen=True)
class Wrapper:
    """A wrapper iterating a batch sampler's DataLoader in a pass: it holds ``ahead`` batches
    back from the loop, and ``ends`` says once it yields the last one; ``began`` is its
    ``iteration`` as the pass began; ``drawn_by`` is the torch DataLoader it iterates, whose
    prefetch tells how far torch's requests run ahead of the batches it returns (delivery.py),
    without looking for that loader on the call stack."""

    ahead: int
    ends: EndOfLoader
    began: int
    drawn_by: torch.utils.data.DataLoader[object]

    def loop_has_last_batch(self) -> bool:
        """Whether the loop has the pass's last batch: the wrapper yielded it (and the loop
        has not begun another pass since), or the pass ran to its end."""
        return self.ends.end_of_dataloader or self.ends.iteration != self.began


def wrapper_of(batch_sampler: object) -> Wrapper | None:
    """The wrapper iterating ``batch_sampler``'s DataLoader now, if it is one that holds
    batches back (None: none, or torch's DataLoader is iterated directly); ConfigError for
    one that would hand batches out and drop them."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return None
    loader = state.GradientState().active_dataloader
    base = getattr(loader, "base_dataloader", None)  # the torch DataLoader it iterates
    if loader is None or base is None:
        return None
    drawn = getattr(base, "batch_sampler", None)
    if drawn is batch_sampler:
        return Wrapper(ahead=1, ends=loader, began=loader.iteration, drawn_by=base)
    if getattr(drawn, "batch_sampler", None) is batch_sampler:
        kind = type(drawn).__name__
        if kind == "SkipBatchSampler":
            raise ConfigError(SKIPPED.format(n=getattr(drawn, "skip_batches", "some")))
        raise ConfigError(RESHARDED.format(n=getattr(drawn, "num_processes", "several")))
    return None
