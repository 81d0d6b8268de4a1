"""Schemathesis's CLI, with Hypothesis's `target` phase left out.

Schemathesis always asks Hypothesis to steer fuzzing toward accepted inputs
(`hypothesis.target`), and Hypothesis 6.170's optimiser for that phase can raise
`IndexError: tuple index out of range` from inside itself (`optimiser.py`,
`attempt_replace`): schemathesis reports it as a "Runtime Error" of the run, a
crash of the tool, not a finding about the API. Every check and phase that looks
at the API stays as it is; only the steering is dropped.

Run as `python tests/integration/schemathesis/run.py <schemathesis arguments>`.
"""

from __future__ import annotations

import sys
from typing import Any

import hypothesis
from schemathesis.cli import schemathesis
from schemathesis.config._projects import ProjectConfig

_settings = ProjectConfig.get_hypothesis_settings


def _without_target(self: ProjectConfig, *args: Any, **kwargs: Any) -> hypothesis.settings:
    got = _settings(self, *args, **kwargs)
    phases = tuple(p for p in got.phases if p is not hypothesis.Phase.target)
    return hypothesis.settings(got, phases=phases)


ProjectConfig.get_hypothesis_settings = _without_target  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "schemathesis"
    sys.exit(schemathesis())
