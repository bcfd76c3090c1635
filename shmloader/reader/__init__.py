"""See DESIGN.md, part 'reader'."""
