"""Every type that crosses a process boundary: msgspec Structs, no logic.

Conventions (docs/architecture.md, "What crosses, and how"):
- frozen, keyword-only Structs that reject unknown fields on input we own;
- units in field names (`_s`, `_mib`, `_at` = unix seconds);
- unknown is `None` inside a process; JSON shapes for operators (admin API)
  write unknown idle time as a negative number, in exactly one place
  (`wire.admin.idle_seconds_json`).
"""
