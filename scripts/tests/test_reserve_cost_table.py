"""docs/llama-cpp.md's table of what mainline's up-front reservation costs is what
scripts/llama/reserve-cost.py makes of the run kept under data/ (the server tables are checked by
ggml/tests/test_ggml.py): a table edited by hand, or data changed without its table, fails here."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(script, *args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llama", script), *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert out, f"{script} {' '.join(args)} printed nothing"
    docs = open(os.path.join(ROOT, "docs", "llama-cpp.md")).read()
    assert out in docs, f"docs/llama-cpp.md lacks the output of scripts/llama/{script} {' '.join(args)}:\n{out}"


def test_the_reservation_cost_table_is_its_run():
    check("reserve-cost.py", "report", "data/h100-2026-11-25-mainline-reserve")
