"""The process's plumbing, no Kubernetes and no admission: pricing in slices (`slicing`), one object's
failure kept its own (`guard`), the event loop's stall meter (`stalls`), file reloads (`filepoll`),
the metric names (`metricnames`). Imports only `quota` (see docs/development/README.md, "Layout")."""
