"""The fast lane: warm allocations (pilot jobs) that run agents' many tiny tasks at
once, instead of one scheduler job each.

``lane`` routes and exposes tasks as jobs; ``pool`` scales a pool's allocations and
dispatches batches through its Dask scheduler; ``worker`` is what an allocation runs;
``launcher`` starts and polices the task processes inside it; ``bridge`` writes what
happens into corral's records. docs/decisions/0001-fast-lane-engine.md says why Dask.
"""
