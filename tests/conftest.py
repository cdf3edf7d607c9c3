"""Shared pytest set-up for the ringcomm tests.

Multi-process tests go through ``harness.run_ranks`` (tests/ is on sys.path because it
has no __init__.py; the spawned ranks get the same sys.path).
"""

import multiprocessing

import pytest


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    """Every test must leave no child process running (the harness kills and reaps)."""
    yield
    alive = [p for p in multiprocessing.active_children() if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, f"processes left running after the test: {alive}"
