"""See DESIGN.md, part 'formats'."""
