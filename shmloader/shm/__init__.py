"""See DESIGN.md, part 'shm'."""
