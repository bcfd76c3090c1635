"""The trainer side: ``SharedTaskDataset``, ``shmloader.DataLoader`` and the batch samplers.

Names are imported on first use, so that importing one of the folders below (the consumption
book, the indices) does not load torch or the reader pool. The folders are layers, each
importing only those below it (docs/architecture.md, checked by scripts/check_layers.py):
``core`` (values) < ``gather`` and ``resume`` < ``waiting`` < ``order`` < ``accounting`` <
``runtime`` < ``dataset.py`` < ``loader.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "SharedTaskDataset": ".dataset",
    "collate": ".dataset",
    "DataLoader": ".loader",
    "TaskBatchSampler": ".order.batch_sampler",
    "TaskSampler": ".order.sampler",
}

if TYPE_CHECKING:
    from .dataset import SharedTaskDataset, collate
    from .loader import DataLoader
    from .order.batch_sampler import TaskBatchSampler
    from .order.sampler import TaskSampler

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = ["DataLoader", "SharedTaskDataset", "TaskBatchSampler", "TaskSampler", "collate"]
