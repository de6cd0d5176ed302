"""The fast lane: warm allocations (pilot jobs) that run agents' many tiny tasks at
once, instead of one scheduler job each.

``lane`` routes and exposes tasks as jobs; ``pool`` ties one pool's parts together:
its ``queue`` of waiting tasks, its ``scaling`` strategy (with ``demand``), its
``breaker`` and its ``engine`` (the listener its workers join: ``wire`` is what crosses
it, ``trust`` what they join with); ``pilots`` makes its allocations batch jobs;
``worker`` is what an allocation runs; ``launcher`` starts and polices the task
processes inside it. docs/decisions/0001-fast-lane-engine.md says how the design was
chosen (on Dask); 0040 why corral's own protocol carries it now, with no pickle across
identities; 0030 why the pool is in parts.
"""
