"""The repository's ``examples/`` folder is importable in every test (``import user_models``): the users'
models the tests plan and run live there, beside the README's examples."""
from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

# The folders whose tests start processes (torchrun, gloo ranks, `meshplan run`): collected first, so that
# under `pytest -n 2 --dist loadfile` (.ci/run) the two workers begin with the long files and end on
# short ones, instead of one worker finishing a two-minute file while the other sits idle.
PROCESS_HEAVY = ("runtime", "codegen")


def pytest_collection_modifyitems(items) -> None:
    here = Path(__file__).resolve().parent

    def heavy_first(item) -> int:
        folder = Path(str(item.path)).resolve().relative_to(here).parts[0]
        return PROCESS_HEAVY.index(folder) if folder in PROCESS_HEAVY else len(PROCESS_HEAVY)

    items.sort(key=heavy_first)  # stable: the order inside each group is pytest's own
