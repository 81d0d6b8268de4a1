"""What `llmgw up` prints: start-up progress and what to try next."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.adminclient.errors import AdminError
from llmgw.wire.admin import ModelView

if TYPE_CHECKING:
    from llmgw.up.main import Up


def _models(up: Up) -> list[ModelView]:
    try:
        return up.client.models()
    except AdminError:
        return []  # a progress display: the next refresh tries again


def show_progress(up: Up, *, timeout_s: float) -> None:
    """Show each model's ready replicas until every model has its minimum (or timeout)."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    console = Console()

    def table(models: list[ModelView], elapsed: float) -> Table:
        t = Table(title=f"replicas starting ({elapsed:.0f}s)", title_justify="left")
        t.add_column("model")
        t.add_column("ready", justify="right")
        t.add_column("min", justify="right")
        t.add_column("note")
        for m in models:
            ready, lo = m.ready, m.min
            note = m.unplaceable_reason or ("" if ready >= lo else "starting…")
            if lo == 0 and ready == 0:
                note = "scales from zero on first request"
            mark = "[green]✓[/]" if ready >= lo else "[yellow]…[/]"
            t.add_row(f"{mark} {m.name}", str(ready), str(lo), note)
        return t

    start = time.monotonic()
    with Live(table([], 0), console=console, refresh_per_second=4, transient=False) as live:
        while not up.stopping:
            elapsed = time.monotonic() - start
            models = _models(up)
            live.update(table(models, elapsed))
            if models and all(m.ready >= m.min for m in models):
                break
            if elapsed > timeout_s:
                console.print("[yellow]some replicas are still starting; see `llmgw ctl status`")
                break
            up.supervise_once()
            time.sleep(1.0)


def _openai_importable() -> bool:
    """Whether `import openai` works here (the snippet is shown only then)."""
    try:
        import openai  # noqa: F401
    except ImportError:
        return False
    return True


def _python() -> str:
    """`python` when that is this interpreter (it has openai), else this interpreter's path."""
    found = shutil.which("python")
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return "python"
    return sys.executable


def current_models(up: Up) -> list[ModelView] | None:
    """The controller's current models (ctl apply's included); None when it does not answer."""
    try:
        return up.client.models()
    except AdminError:
        return None


def print_hints(up: Up) -> None:
    # The controller's specs, not the fleet file's: after a restart they include
    # models added since with `ctl apply` (the controller keeps them in its store).
    views = current_models(up)
    if views is None:
        models = [m.name for m in up.fleet.models]
        note = "  (from the fleet file: the controller did not answer)"
    else:
        models = [m.name for m in views]
        note = ""
    # A model with a ready replica answers the example at once.
    ready = [m.name for m in views or [] if m.ready > 0]
    first = ready[0] if ready else (models[0] if models else "MODEL")
    # ctl's defaults match up's (controller on 127.0.0.1:8081, the admin token in
    # ./.llmgw/tokens/admin); say more only when they do not. Never the token itself.
    env = ""
    if up.controller_url != "http://127.0.0.1:8081":
        env += f"LLMGW_CONTROLLER={up.controller_url} "
    if up.tokens is not None and up.state != Path.cwd() / ".llmgw":
        env += f"LLMGW_TOKEN_FILE={up.tokens.path('admin')} "
    # The same program the user ran, so the hint works without an activated venv.
    prog = sys.argv[0] if os.path.basename(sys.argv[0]) == "llmgw" else "llmgw"
    snippet = ""
    if _openai_importable():
        snippet = f"""
  {_python()} -c "import openai; c = openai.OpenAI(base_url='{up.router_url}/v1', api_key='x'); \\
print(c.chat.completions.create(model='{first}', \\
messages=[{{'role': 'user', 'content': 'Hello!'}}]).choices[0].message.content)"
"""
    print(
        f"""
llmgw is up.
  router (OpenAI API)  {up.router_url}/v1
  controller           {up.controller_url}
  status page          {up.status_url}
  metrics              {up.router_url}/metrics · {up.controller_url}/metrics
  logs                 {up.logs}
  models               {", ".join(models) or "none"}{note}

Try:
  curl -s {up.router_url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{first}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
{snippet}
  {env}{prog} ctl status

Ctrl-C stops everything.""",
        flush=True,
    )
