"""The edges: thin translations of HTTP, MCP, the command line, the Slurm shims and the dashboard into the core's verbs."""
