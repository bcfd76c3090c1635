"""The loader's state for ``torch.distributed.checkpoint`` (DCP), saved at one world size and
loaded at another.

DCP loads into the keys of the state dict it is given, and a loader's state has keys of its
own (task ids, ranges) that a job about to resume cannot know. So :class:`DCPState` gives DCP
one fixed key holding the state as JSON text: under torchrun, the whole job's state
(``DataLoader.state_dict``), the same on every rank, so DCP's deduplication keeps one copy
and any number of ranks loads it. Before the loader starts (DCP asks for a state to load
into) it gives an empty value and starts nothing.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class _Loader(Protocol):
    """What DCPState needs of a loader: shmloader.DataLoader, or a SharedTaskDataset."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    @property
    def started(self) -> bool: ...


KEY = "shmloader"


class DCPState:
    """``loader`` as a ``torch.distributed.checkpoint.stateful.Stateful``::

        import torch.distributed.checkpoint as dcp
        dcp.save({"model": model, "data": shmloader.DCPState(loader)}, checkpoint_id=path)
        ...
        dcp.load({"model": model, "data": shmloader.DCPState(loader)}, checkpoint_id=path)

    Every rank saves at the same step (``state_dict`` gathers the whole job's state); a job
    of any number of ranks loads it before its first batch."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, str]:
        if not self.loader.started:  # DCP asks for what to load into: start nothing
            return {KEY: ""}
        return {KEY: json.dumps(self.loader.state_dict())}

    def load_state_dict(self, state: dict[str, str]) -> None:
        text = state.get(KEY, "")
        if text:
            self.loader.load_state_dict(json.loads(text))
