"""The reconcile loop: leadership, then one tick that decides (purely) and commits (one
transaction) what changes in the fleet; on the leader, the retention that deletes token
usage and events past their age (retention.py); a failure every tick meets is logged
once, then every few minutes (runtime/repeats.py).
"""
