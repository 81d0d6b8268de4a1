"""`ctl bench REPLICA` (placeholder until the load driver lands)."""

from __future__ import annotations

import argparse

from llmgw.ctl.context import Ctx
from llmgw.ctl.errors import CtlError


def bench(args: argparse.Namespace, ctx: Ctx) -> int:
    raise CtlError("bench: not built yet")
