"""The fast lane: warm allocations (pilot jobs) that run agents' many tiny tasks at
once, instead of one scheduler job each.

``lane`` routes and exposes tasks as jobs; ``pool`` ties one pool's parts together:
its ``queue`` of waiting tasks, its ``scaling`` strategy (with ``demand``), its
``breaker`` and its ``engine`` (the Dask scheduler batches go through); ``pilots`` makes
its allocations batch jobs; ``worker`` is what an allocation runs; ``launcher`` starts
and polices the task processes inside it. docs/decisions/0001-fast-lane-engine.md says
why Dask; 0030 why the pool is in parts.
"""
