"""One request's way through the router, from its body to its answer.

intake.py       the body: bounded, timed, decoded once
auth.py         client keys and the admin token (headers in, verdicts out)
tenants.py      what a key may do: models, rate limits, budgets
refusals.py     the router's own error answers (OpenAI's shape): 400, 401, 404, 413, 503
proxy.py        parse, choose, forward, retry what is safe, relay
holding.py      requests held while a model has no replica (scale from zero, waking)
flow.py         flow control's queues: priority bands, fair queueing per tenant, bounds
flowgate.py     flow control's waiting and waking at saturation, on the loop
lora.py         a request for a LoRA adapter and its answer's name
inband.py       an engine's error event inside a 200 stream
streamend.py    whether a stream's final event has gone out
tokens.py       token counts from the engines' usage (types: usagetypes.py)
tracing.py      W3C trace context passed on, spans of the router's decisions
"""
