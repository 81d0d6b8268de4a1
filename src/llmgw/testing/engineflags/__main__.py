"""`python -m llmgw.testing.engineflags [vllm|sglang …]`: fetch the pinned releases' flags."""

import sys

from llmgw.testing.engineflags.releases import main

sys.exit(main())
