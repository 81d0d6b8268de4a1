"""The router's link to its controller (or its own file when it stands alone).

sources.py        where the configuration and the endpoint list come from
usagereports.py   what the router saw, reported to the controller once a tick
"""
