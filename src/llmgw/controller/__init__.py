"""The controller: fleet state, placement, reconcile, and the admin API.

Layout (each sub-package's docstring says more):

    main.py, config.py, app.py   the program: flags, wiring, the aiohttp app
    errors.py                    ControllerError and its subclasses (no HTTP in them)
    idle.py                      what routers report: idle time, in-flight, demand, load
    leases.py, leasebook.py      each router's share of every limited key: the split
                                 (pure) and the book of what is leased to whom
    logasks.py                   engine logs asked of agents, answered by heartbeats
    leaderlink.py                a standby's way to the leader: the URL the leader
                                 records, and routers' usage reports relayed there
    fleet/                       the fleet as values (records), the one way to change
                                 them (batch), the leader's live copy, heartbeats,
                                 endpoint lists and operator commands decided purely
    tick/                        the reconcile loop: leadership, then plan and commit
    placement/                   free capacity, placement rules, the tick's placement
                                 requests, idle eviction, compaction
    api/                         the HTTP edge: routes, validation, admin views, summary,
                                 OpenAPI; the only place errors become HTTP statuses
    store/                       where the state lives (SQLite, PostgreSQL, memory)
"""
