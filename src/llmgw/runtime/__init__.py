"""Shared runtime: what every program uses, and nothing program-specific.

serve        uvloop, bind, ready line, graceful stop (with httpserver, acceptor); a
             program may bring its own server for its connections (the router's http/)
peers        what one client address holds of a server's shared budgets
clock        the injected clock
logs         logging setup, --log-format
repeats      a failure that repeats every tick logged once, then every few minutes
cli          help text every program's flags share
readergone   a standard stream whose reader went away pointed at /dev/null
version      --version on every program
secretfile   secrets from a file or the environment, never only argv
envflags     every flag also from LLMGW_<PROGRAM>_<FLAG>
configfile   flags from a YAML file (the controller's --config)
textfile     a config's or secret's file read with bounds: a regular file, its size, UTF-8
safeyaml     a config's YAML without alias bombs or a RecursionError
finite       float settings are finite: NaN and ±inf refused where settings are parsed
sdnotify     systemd's READY=1, STOPPING=1 and watchdog
procmetrics  the process_* metrics, also under a unit's ProcSubset=pid
lockfile     one process per state folder
netaddr      address helpers
webpages     what a web page may not ask of a server without a token (writes, rebound names)
tracing      OpenTelemetry span export (router and controller), the SDK loaded only when on;
             the spans it loses counted for /metrics
spanqueue    the SDK's batch processor, bounded and counted (imported only when tracing is on)
"""
