"""See DESIGN.md, part 'stats'."""
