"""The repository's ``examples/`` folder is importable in every test (``import user_models``): the users'
models the tests plan and run live there, beside the README's examples."""
from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
