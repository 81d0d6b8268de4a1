"""The fleet as the controller knows it: plain values, the one way to change them, and the
leader's live copy written through the store; heartbeats, endpoint lists and operator
commands decided against it.
"""
