"""llmgw up: the whole system on one machine.

main.py       the command: checks, start order, supervise, stop
fleet.py      the fleet file, validated before anything starts
checks.py     one `up` per state folder, its entries' kinds, free ports
tokens.py     the programs' tokens, 0600 files in the state folder
children.py   one started program: start, ready line, stop by pid
leftovers.py  stop what a killed `up` left running (its manifest)
say.py        messages that a gone reader cannot turn into a skipped stop
show.py       start-up progress and what to try next
"""
