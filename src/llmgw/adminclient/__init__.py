"""The controller's admin API as a Python client, shared by `llmgw ctl` and `llmgw up`.

A bottom-layer package (like `llmgw.wire`, whose types it returns): it imports no
program package, so every program that talks to the admin API uses this one client
instead of its own. docs/controller.md lists the routes.

- `client.py`: `AdminClient` (one method per route) over a `Transport` (urllib, or a
  fake in tests);
- `bounded.py`: the urllib transport's answer read whole within a deadline and a
  size bound;
- `pages.py`: the next page's cursor, read from a paged list's `Link` header
  (`AdminClient.keys()` and `.models()` follow every page);
- `foreign.py`: answers that are not the controller's JSON (a proxy's page, a
  compressed body) undone or described in one line;
- `errors.py`: `AdminError` and its subclasses, the only exceptions a call raises.

Import from the submodules. This file imports nothing, so `llmgw ctl --help` can load
the errors without msgspec or urllib.
"""
