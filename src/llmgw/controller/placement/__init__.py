"""Where replicas go: free capacity, the placement rules, the tick's placement requests, and
idle eviction when a model does not fit.
"""
