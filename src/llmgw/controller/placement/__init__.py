"""Where replicas go: free capacity, the placement rules, the tick's placement requests, and
idle eviction or compaction when a model does not fit.

    capacity.py    free cards per node, indexed for placement
    rules.py       where one replica fits (best fit, whole nodes, fabrics)
    requests.py    the tick's placement requests: place, or evict or move to make room
    eviction.py    which known-idle replicas to evict so a model fits
    compaction.py  which serving replicas to move (make-before-break) so a model fits
                   a fragmented fleet
    wakes.py       where a replica may sleep (GPU and host memory), which sleeper wakes
    swaps.py       a tick's sleeps and wakes, written into its batch
    clearing.py    idle replicas put to sleep ahead of the sleeper under them
    rendezvous.py  multi-node rendezvous ports
    tickview.py    what a tick's placement reads for every model it cannot place, kept once
"""
