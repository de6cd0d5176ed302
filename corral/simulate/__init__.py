"""A facility simulator: a cluster, its scheduler and its controller, with people and
agents, run under three policies (agents as ordinary users, through corral, banned).
See docs/simulation.md; ``corral simulate`` is the command."""
