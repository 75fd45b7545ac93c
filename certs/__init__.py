"""certs package (see docs/design.md, "Certificates")."""
