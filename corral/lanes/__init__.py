"""Lanes: where a recorded job runs (local, Slurm, the fast lane), behind one registry."""
