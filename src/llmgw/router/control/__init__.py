"""The router's link to its controller (or its own file when it stands alone).

sources.py        where the configuration and the endpoint list come from
reloadstatus.py   what became of the file's last load (/admin/config, the reload gauges)
listread.py       the endpoint list read entry by entry (a newer controller's additions)
usagereports.py   what the router saw, reported to the controller once a tick
tokenusage.py     client keys' token usage: counted per request, reported as totals
leases.py         this router's shares of limited keys: demand out, leases in, fallback
"""
