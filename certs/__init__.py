"""certs package (see ../shared/DESIGN.md)."""
