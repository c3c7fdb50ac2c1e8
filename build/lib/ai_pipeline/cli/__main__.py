"""``python -m ai_pipeline.cli``: the same as the ``ai-pipeline`` command."""

import sys

from ai_pipeline.cli import main

sys.exit(main())
