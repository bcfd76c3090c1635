"""Waiting for ready tasks: the board readers pin tasks on, tasks elsewhere, the lease check."""
