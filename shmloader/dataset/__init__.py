"""The trainer-facing part: ``SharedTaskDataset``, its sampler, collate and ``DataLoader``."""

from .dataset import SharedTaskDataset, collate
from .loader import DataLoader
from .sampler import TaskBatchSampler, TaskSampler

__all__ = ["DataLoader", "SharedTaskDataset", "TaskBatchSampler", "TaskSampler", "collate"]
