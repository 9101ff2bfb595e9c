"""docs/llama-cpp.md's measured tables of mainline llama.cpp are what their report scripts make of
the raw runs kept under data/: a table edited by hand, or data changed without its table, fails
here."""
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


def test_the_server_load_table_is_its_run():
    check("server-report.py", "data/h100-2026-11-25-mainline-server-500")


def test_the_server_oom_table_is_its_run():
    check("server-report.py", "data/h100-2026-11-25-mainline-server-oom", "--marker", "server-oom")


def test_the_reservation_cost_table_is_its_run():
    check("reserve-cost.py", "report", "data/h100-2026-11-25-mainline-reserve")
