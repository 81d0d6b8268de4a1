"""Library code for tests and benchmarks: real processes on 127.0.0.1, a manual clock.

Imported on their own (they pull in the router): `llmgw.testing.forwarder`, an
in-memory `Forwarder` with scripted engines, and `llmgw.testing.vtime`, an event
loop whose time is a `ManualClock`. `python -m llmgw.testing.configdoc` writes
docs/configuration.md from the programs' parsers; `llmgw.testing.wheel` builds llmgw's
wheel once per source tree (cached), for the tests that install it;
`llmgw.testing.otlp`, an OTLP/HTTP receiver decoding the spans programs export
(needs the `tracing` extra). `llmgw.testing.engineflags` reads the flags vLLM's and
SGLang's pinned releases accept from their source (`python -m llmgw.testing.engineflags`
fetches them) and checks a command line against them; `llmgw.testing.enginesleep`
reads vLLM's sleep-mode routes the same way. `wait_until` and `until` (`llmgw.testing.wait`) are
the one way a test waits for a condition, instead of a fixed sleep.
"""

from llmgw.runtime.clock import ManualClock
from llmgw.testing.procs import Program, free_port, start_program, up_engine_ports
from llmgw.testing.wait import until, wait_until

__all__ = [
    "ManualClock",
    "Program",
    "free_port",
    "start_program",
    "until",
    "up_engine_ports",
    "wait_until",
]
