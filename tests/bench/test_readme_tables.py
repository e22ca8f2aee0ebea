"""The README's benchmark tables are the committed results, rendered (never typed by hand)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import readme_tables  # noqa: E402


def test_readme_tables_match_the_results_files():
    text = (ROOT / "README.md").read_text()
    assert readme_tables.update(text) == text, \
        "README.md's benchmark tables are stale: run python benchmarks/readme_tables.py"


def test_every_row_names_its_file_and_a_checked_target():
    for line in readme_tables.render().splitlines():
        if line.startswith("| ") and not line.startswith("| case"):
            assert line.rstrip().endswith(".json` |"), line
