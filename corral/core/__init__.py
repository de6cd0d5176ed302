"""The facility core: the service every edge calls, jobs, principals, the store, configuration."""
