"""See DESIGN.md, part 'master'."""
