"""One request's way through the router, from its body to its answer.

intake.py       the body: bounded, timed, decoded once
auth.py         client keys and the admin token (headers in, verdicts out)
tenants.py      what a key may do: models, rate limits, budgets
buckets.py      ... its RPM and TPM token buckets (this process's, or its workers' row)
refusals.py     the router's own error answers (OpenAI's shape): 400, 401, 404, 413, 503
admission.py    whether a read request goes on: its model known, its key's limits
proxy.py        the proxied routes: parse, then route (choose, attempt, relay, count)
call.py         one routed request: what it asked for, what became of it; request ids
attempts.py     one attempt at a replica, and the rule for trying another
relay.py        an engine's event stream relayed as it arrives; its verdict
unbuffered.py   a whole answer over max_answer_bytes, relayed as it arrives
waits.py        waiting for a replica (held) or for a turn (flow control)
accounting.py   each request counted once: metrics, token counts, the access log
listing.py      /v1/models, one model (OpenAI's or Anthropic's shape), 404/405 for the rest
holding.py      requests held while a model has no replica (scale from zero, waking)
flow.py         flow control's queues: priority bands, fair queueing per tenant, bounds
flowgate.py     flow control's waiting and waking at saturation, on the loop
flowpeers.py    flow control across a router's workers: claims, counts, reserves
holdpoint.py    each replica's hold point: the load its engine runs without a queue
reserve.py      the critical reserve: when a model keeps room for its critical band, how much
enginepriority.py  the `priority` an engine with priority scheduling gets (key's band)
lora.py         a request for a LoRA adapter and its answer's name
inband.py       an engine's error event inside a 200 stream
streamend.py    whether a stream's final event has gone out
tokens.py       token counts from the engines' usage (types: wire/answerusage.py)
usagebound.py   what one answer's usage may count: held to what its request allows
tracing.py      W3C trace context passed on, spans of the router's decisions
"""
