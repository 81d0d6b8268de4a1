"""The reconcile loop: leadership, then one tick that decides (purely) and commits (one
transaction) what changes in the fleet.
"""
