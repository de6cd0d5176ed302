"""Workload analytics: what a facility's agents do, from its own accounting data.

``ingest`` turns sacct (parsable2 or JSON), SWF traces and corral's own job records
into one job table (``frame.COLUMNS``); ``classify`` decides who is an agent (exact
from corral's provenance, else from per-user behaviour, always overridable);
``report`` measures agents against humans; ``render`` shows it as a terminal table,
JSON or a self-contained HTML page; ``synth`` writes a calibrated synthetic facility
with ground truth. Everything is column-wise in polars: no Python loop per job.
"""
