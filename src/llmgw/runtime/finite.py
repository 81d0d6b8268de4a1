"""Float settings are finite numbers: NaN and ±inf are refused where settings are parsed.

Every comparison with NaN is False, so a range check such as `if x <= 0: error`
lets it through, and the program starts, serves, then fails far from the setting
(`int(nan)` raised in the controller's reconcile loop); an infinite timeout never
fires and an infinite interval never ticks. No setting documents either as
meaningful, so both are refused at parse time, in one place per program:

- `finite_float`, the argparse type of every float flag (and so of its
  `LLMGW_<PROGRAM>_<FLAG>` variable and its key in a `--config` file, which
  envflags and configfile convert with the flag's own type);
- `nonfinite_path`, one walk over a YAML document or a parsed config Struct
  (the router's file, the agent's, `llmgw up`'s fleet file), naming the first
  setting that is not finite.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping

# What a refusal says after the setting's name.
NOT_FINITE = "not a finite number (nan and inf are refused)"


def finite_float(text: str) -> float:
    """argparse `type=`: `float(text)`, refusing NaN and ±inf (ArgumentTypeError, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(NOT_FINITE)
    return value


def nonfinite_path(value: object, path: str = "") -> str | None:
    """The path (`endpoints[0].weight`) of the first float in `value` that is NaN or
    infinite, walking mappings, lists, tuples and msgspec Structs; None when all are
    finite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    # A msgspec Struct, known by its field names: importing msgspec here would load it
    # into `llmgw ctl`'s start, which takes float flags and must stay light.
    fields = getattr(type(value), "__struct_fields__", None)
    if isinstance(fields, tuple):
        items: list[tuple[str, object]] = [(name, getattr(value, name)) for name in fields]
    elif isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = nonfinite_path(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    else:
        return None
    for key, item in items:
        found = nonfinite_path(item, f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None
