"""The router: one OpenAI-compatible API in front of every engine replica.

Layout (each sub-package's docstring says more); a request goes down this list:

    main.py, config.py   the program: flags, the YAML file, the compiled build's loading
    http/                its own HTTP/1.1 server (connections, parsing, answer heads)
                         and the route table
    app.py, wiring.py    the state and background loops; the live parts wired together
    compiled.py          the optional mypyc build of the hot modules, loaded by `main`
    errors.py            RouterError and its subclasses (their answers: request/refusals.py)
    metrics.py           the router's own Prometheus series
    request/             one request's way through: intake, keys and tenants, the proxy
                         (choose, forward, retry, relay), holding, token counts
    apis/                the APIs passed through beside chat and completions
                         (Responses, Anthropic Messages, tokenize, rerank, audio)
    routing/             which replica: scheduler, policies, prefix affinity, session
                         hints, the engines' KV events and the answers' feedback
    replicas/            the replicas and their live state: registry, stats, circuit
                         breakers, the /metrics scrape
    upstream/            how the router talks to engines (keep-alive pools)
    control/             the controller link: endpoint lists and config, usage reports
    workers/             `--workers N`: the pool, each worker, their channel, the
                         in-flight and key tables they share, merged metrics

Importing this package runs nothing: `main` loads the compiled build before it
imports any of the hot modules (compiled.py).
"""
