"""Help text every program's flags share: each flag says what it does and its default.

`DefaultsFormatter` appends ` (default: X)` to a flag's help unless the help
already names its default, the default is "nothing" (None, False, empty,
SUPPRESS), or the flag is required. `tests/unit/test_cli_help.py` walks every
program's parser and fails on a flag without help.
"""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or "%(default)" in text
            or action.required
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or default == ""
            or not action.option_strings
        ):
            return text
        shown = ",".join(str(d) for d in default) if isinstance(default, list | tuple) else default
        return f"{text} (default: {shown})".strip()
