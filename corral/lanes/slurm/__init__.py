"""The Slurm lane: the backend, its vocabulary, the agents' tiers and the privileged submitter."""
