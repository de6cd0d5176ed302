"""The control plane: one reconciler that polls the backend for every job at once,
the watchers whose long-polls it wakes, and the metrics that show its load."""
