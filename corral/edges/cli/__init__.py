"""The command line: ``corral`` and its commands."""
