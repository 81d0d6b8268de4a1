"""The flags vLLM's and SGLang's real command lines accept, read from their released source.

Neither engine runs here (both need a GPU), and neither argument parser can be
imported without the engine's own dependencies: both build the parser inside
packages that import torch and much more at import time (tried with stubbed
modules: vLLM's `vllm.config` pulls in its model executor and distributed
layers, SGLang's `server_args` its runtime utilities). So the parsers are read
statically instead, from the Python files of the pinned release's wheel, by the
same rules the engines use to build them.

Layout:
  releases     the pinned releases (`PINNED`): fetch a wheel's parser sources,
               read them, cache the flags; `python -m llmgw.testing.engineflags`
  vllm         how `vllm serve` builds its parser, read from its source
  sglang       how `sglang.launch_server` builds its parser, read from its source
  reading      what both readers share: parsing a file, argparse's own rules
  commandline  `Cli` (one release's flags and their arity) and `check(cli, argv)`,
               with what the check leaves unchecked

tests/integration/test_engine_flags.py checks every command line the agent's
templates render.
"""

from llmgw.testing.engineflags.commandline import Arity, Cli, EngineFlagsError, check
from llmgw.testing.engineflags.releases import PINNED, cache_root, cached, extract, fetch

__all__ = [
    "PINNED",
    "Arity",
    "Cli",
    "EngineFlagsError",
    "cache_root",
    "cached",
    "check",
    "extract",
    "fetch",
]
