"""`llmgw router --workers N`: one listening port, N worker processes.

pool.py           the parent: starts, watches and restarts the workers; scrapes,
                  reloads and follows the controller once for all of them
worker.py         one worker: its start and its link to the parent
ipc.py            the messages between them
shared.py         what the workers share in memory: in-flight counts
keytable.py       ... and the limited keys' RPM, TPM, budget and allowance counts, a row each
metricsmerge.py   one /metrics page from the workers' pages
reportmerge.py    one usage report from the workers' reports
"""
