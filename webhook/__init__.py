"""webhook package (see ../shared/DESIGN.md)."""
