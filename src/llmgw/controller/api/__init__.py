"""The HTTP edge: the only place controller errors become HTTP statuses.

Layout:
    routes.py     the handlers, the route table, the error middleware
    decode.py     bodies and query parameters in: 400 not JSON, 422 wrong type
    auth.py       which token may call which route
    http.py       controller refusals → (status, error type)
    keys.py       the /admin/keys routes (client keys)
    logs.py       a replica's engine log, asked of its node's agent (../logasks.py)
    pages.py      lists in pages (/admin/keys, /admin/models): cursor in, next link out
    usage.py      routers' usage reports in (POST /v1/usage), token usage out
                  (GET /admin/usage)
    validate.py   rules a spec, heartbeat or usage report must keep
    services.py   what handlers call: the fleet, usage, events, the clock
    views.py      the admin tables, built from the fleet state
    summary.py    the fleet summary: how full, what is broken
    status.py     the status page: its files and its one data route
    metrics.py    the controller's Prometheus metrics (GET /metrics)
    fleetview.py  one consistent picture of the fleet for /metrics and the status page
    openapi.py    the OpenAPI document (/openapi.json); schemarules.py, the edge's
                  bounds written into its generated schemas
"""
