from llmgw.cli import main

raise SystemExit(main())
