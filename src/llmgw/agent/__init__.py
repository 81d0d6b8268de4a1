"""The agent: one per GPU node; discovers its GPUs, runs and supervises engines (docs/agent.md).

Layout:

    main.py, config.py, app.py   the program: flags (over an optional YAML file), wiring,
                                 the loopback HTTP surface
    service.py                   GPUs, engines and heartbeats wired together, as three loops
    heartbeat.py, replyread.py   report what is, receive what should be (shard by shard)
    supervisor.py, shards.py     start what is desired, stop what is not, say how each does
    enginecalls.py               calls to running engines (sleep, wake, adapters), beside the tick
    engineprocs.py, probe.py     engine processes (started or adopted) and their readiness
    templates.py, ports.py       engine command lines, one pure function per engine; ports
    adapters.py                  LoRA adapters: start flags, run-time loading
    sleeping.py, vllmguard/      sleep and wake on the controller's word; the key guard the
                                 agent loads into vLLM for its dev-mode routes
    waking.py, quiet.py          a wake's warm-up tried again alone; a sleep postponed
                                 while its engine still has requests
    policy.py, secretrefs.py     what a spec may make this node run; `env_from` secrets
    statefile.py, leftovers.py   the re-adoption state file; stopping engines whose agent
                                 is gone
    logfiles.py, metrics.py      per-engine log files; the agent's Prometheus metrics
    logtail.py, logasks.py       a log's last lines read from its end; the controller's
                                 log asks answered with the next heartbeat
    hostmem.py, gpus/            host memory; GPU discovery (NVML, or a fake inventory)
    errors.py                    the agent's exception root
"""
