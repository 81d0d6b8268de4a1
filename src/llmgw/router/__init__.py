"""llmgw router.

Before any of its modules is imported: the compiled build of the hottest ones, when
there is one for these sources (compiled.py, scripts/build-mypyc).
"""

from llmgw.router import compiled

compiled.load()
