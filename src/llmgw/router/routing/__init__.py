"""Which replica serves a request: pure choices, and the signals they read.

scheduler.py   the choice itself: pure and explainable (schedconfig.py: its settings)
policies.py    ours (scheduler + prefix affinity) and the baselines to measure it by
blockhash.py   a request's chain of block hashes, and the memos that make it cheap
prefix.py      which replica holds which block hashes (the prefix index)
rendezvous.py  a request's home replica: rendezvous hashing of its first block
affinity.py    session hints: a second signal beside the content
feedback.py    the engine's answer checks the prefix index's guess
kvevents.py    precise mode: each engine's prefix cache as its KV events tell it
kvfollow.py    the subscriptions to the engines' KV-event publishers
"""
