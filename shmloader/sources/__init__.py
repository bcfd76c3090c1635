"""See DESIGN.md, part 'sources'."""
