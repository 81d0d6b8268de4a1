"""The agent's one exception root. Each subclass lives beside the code that raises it:

    AgentError
    ├── AgentConfigError          config.py: a configuration a person must fix (exit 2)
    ├── StateDirBusy              statefile.py: the state folder is held or refused, at start
    │                             or at run time (exit 2, one line)
    ├── LogDirBusy                logfiles.py: the log folder is held or refused, at start
    │                             (exit 2, one line)
    ├── GpuError                  gpus/base.py: GPU discovery and fault injection
    │   ├── GpuDiscoveryError     no driver, no GPUs, bad fake spec (exit 2)
    │   ├── UnknownGpu            no GPU has that index (the faults route answers 404)
    │   └── FaultInjectionUnsupported  real GPUs cannot be made unhealthy on request (409)
    ├── SpawnError                engineprocs.py: an engine could not be started at all
    ├── SpecRefused               policy.py: the spec asks for env or flags this node refuses
    ├── NoFreePort                ports.py: the engine port range is used up
    ├── RendezvousPortTaken       ports.py: a multi-node shard's rendezvous port is busy
    └── HeartbeatFailed           heartbeat.py: no usable answer from any controller
        └── HeartbeatRejected     the controller answered 4xx (bad token, unknown route)

The shard-level ones (SpawnError, SpecRefused, the port errors) fail that shard with the message as
its reason; the heartbeat ones are retried with backoff; the others end the agent with
one line on stderr.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every exception the agent raises on purpose."""
