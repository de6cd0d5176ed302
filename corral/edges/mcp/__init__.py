"""The MCP edge: corral's tools for coding agents, in the gateway and as a stdio relay."""
