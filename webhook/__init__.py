"""webhook package (see docs/design.md, "Admission" and "Accounting")."""
