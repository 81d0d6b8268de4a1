"""`llmgw` command line: a thin dispatcher with lazy imports.

Each subcommand lives in its own program package and exposes
`main(argv: list[str]) -> int`; nothing is imported until a subcommand is
chosen, so `llmgw ctl --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

# subcommand → (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("llmgw.up.main", "run the whole system on this machine (simulated GPUs)"),
    "router": ("llmgw.router.main", "the OpenAI-compatible router (data plane)"),
    "controller": ("llmgw.controller.main", "fleet state, placement and reconcile"),
    "agent": ("llmgw.agent.main", "one per GPU node: discovers GPUs, runs engines"),
    "sim-engine": ("llmgw.simengine.main", "a simulated vLLM/SGLang engine"),
    "ctl": ("llmgw.ctl.main", "the operator's CLI"),
}

USAGE = "usage: llmgw <command> [options]\n\ncommands:\n" + "".join(
    f"  {name:<12} {help_}\n" for name, (_, help_) in COMMANDS.items()
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from llmgw.runtime.version import line

        print(line())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"llmgw: unknown command {name!r}\n\n{USAGE}")
        return 2
    module_name = COMMANDS[name][0]
    try:
        return _run(name, module_name, rest)
    except KeyboardInterrupt:
        # A Ctrl-C before the program set its own handlers (while importing, in the
        # first second): nothing has started, yet it was a 20-line traceback.
        return 130


def _run(name: str, module_name: str, rest: list[str]) -> int:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            sys.stderr.write(f"llmgw {name}: not built yet\n")
            return 2
        raise
    code: int = module.main(rest)
    return code
