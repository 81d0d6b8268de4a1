"""Shared runtime: serve (uvloop, runner, graceful stop), clock, logging."""
