"""docs/pytorch.md's measured tables are what scripts/torch/report.py makes of the raw runs kept
under data/: a table edited by hand, or data changed without its table, fails here."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "data/h100-2026-11-22-pytorch"


def blocks(*args):
    """The report's output as blocks of consecutive non-empty lines."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "torch", "report.py"), *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [b.strip("\n") for b in out.split("\n\n") if b.strip()]


def check(*args):
    docs = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    got = blocks(*args)
    assert got, f"report.py {' '.join(args)} printed nothing"
    for b in got:
        assert b in docs, (f"docs/pytorch.md lacks this block of python3 scripts/torch/report.py "
                           f"{' '.join(args)}:\n{b}")


def test_the_five_allocators_tables_are_their_runs():
    check(f"{DATA}/prefill-llama3.jsonl", f"{DATA}/prefill-phi3.jsonl")


def test_the_final_settings_tables_are_their_runs():
    check(f"{DATA}/prefill-final.jsonl")


def test_the_micro_benchmark_table_is_its_run():
    check("--micro", f"{DATA}/micro.jsonl")


def test_the_sleep_and_wake_table_is_its_run():
    check("--sleep", "data/h100-2026-11-25-sleep/sleep.jsonl")


def test_the_threads_tables_are_their_runs():
    check("--threads", "data/h100-2026-11-25-threads-2")


def test_the_page_recycling_tables_are_their_run():
    check("data/h100-2026-11-25-recycle/prefill.jsonl")


def test_the_recycling_pages_tables_are_their_runs():
    check("data/h100-2026-11-25-recycle-pages/prefill.jsonl")


def test_the_recycling_on_and_off_table_is_its_runs():
    check("data/h100-2026-11-25-recycle-off/prefill.jsonl")
