"""See DESIGN.md, part 'dataset'."""
