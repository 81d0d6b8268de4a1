"""Schemathesis's CLI, with two crashes of the tools themselves worked around.

1. Hypothesis's `target` phase is left out. Schemathesis always asks Hypothesis to
   steer fuzzing toward accepted inputs (`hypothesis.target`), and Hypothesis
   6.170's optimiser for that phase can raise `IndexError: tuple index out of
   range` from inside itself (`optimiser.py`, `attempt_replace`).
2. Hypothesis names each filter by the source of its lambda, parsing the module it
   comes from; on CPython 3.11.7 parsing schemathesis's 4,500-line coverage module
   can raise `SystemError: AST constructor recursion depth mismatch` (a CPython bug
   in the AST validator's depth count). Such a name then reads `lambda x:
   <unknown>`, as Hypothesis writes it for any source it cannot read.

Schemathesis reports either as a "Runtime Error" of the run: a crash of the tool,
not a finding about the API. Every check and phase that looks at the API stays as
it is; only the steering and a label are dropped.

Run as `python tests/integration/schemathesis/run.py <schemathesis arguments>`.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import hypothesis
import hypothesis.internal.lambda_sources as lambda_sources
from schemathesis.cli import schemathesis
from schemathesis.config._projects import ProjectConfig

_settings = ProjectConfig.get_hypothesis_settings


def _without_target(self: ProjectConfig, *args: Any, **kwargs: Any) -> hypothesis.settings:
    got = _settings(self, *args, **kwargs)
    phases = tuple(p for p in got.phases if p is not hypothesis.Phase.target)
    return hypothesis.settings(got, phases=phases)


ProjectConfig.get_hypothesis_settings = _without_target  # type: ignore[method-assign]

_describe = lambda_sources._lambda_description


def _description(f: Any, *args: Any, **kwargs: Any) -> str:
    try:
        got: str = _describe(f, *args, **kwargs)
    except SystemError:
        params = str(inspect.signature(f))[1:-1]
        return f"lambda {params}: <unknown>" if params else "lambda: <unknown>"
    return got


lambda_sources._lambda_description = _description

if __name__ == "__main__":
    sys.argv[0] = "schemathesis"
    sys.exit(schemathesis())
