"""The replicas the router can send to, and their live state.

registry.py        replicas with their in-flight counts, stats and health
snapshot.py        a replica as the registry shows it (`Snapshot`)
stats.py           one scrape of a replica (`Stats`)
pace.py            what two scrapes say of an engine's pace: drain rate, prefill cost
enginemetrics.py   an engine's /metrics page read into `Stats`
scrape.py          the scrape loop: every replica's /metrics, every tick
breaker.py         the circuit breaker per replica, with LLM-aware failure classes
"""
