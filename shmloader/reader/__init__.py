"""Reader processes: each leases a task from the master, reads and decodes it with the source, and
writes it into shared memory for the trainer (docs/architecture.md)."""
