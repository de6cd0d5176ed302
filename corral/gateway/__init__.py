"""The gateway: the service every edge calls (its verbs), the runtime that assembles it and
runs its loops, the checks before a job is recorded, and the verbs of accounts, memory and storage."""
