"""Library code for tests and benchmarks: real processes on 127.0.0.1, a manual clock."""

from llmgw.runtime.clock import ManualClock
from llmgw.testing.procs import Program, free_port, start_program

__all__ = ["ManualClock", "Program", "free_port", "start_program"]
