"""Waiting for ready tasks: the board readers pin tasks on, strays, the lease check."""
