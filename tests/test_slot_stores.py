"""How a shared-memory writer stores its slots (transport/shm/slot_stores.h):
the rule `auto` follows, driven with made-up costs through the test hooks, the
setting, and the check of what a peer publishes in shared memory. (Every
collective with every slot streamed: test_collectives.py::test_streamed_slot_stores.)"""
import math
import struct

import pytest

from ringcomm import _C_testing as T
from ringcomm.config import make_config

NS = 1e-9  # a cost of 1 ns per byte


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def test_no_switch_until_both_ways_are_measured_at_both_ends():
    for write, read in (([0, 0], [0, 0]), ([1 * NS, 0], [1 * NS, 0.1 * NS]), ([1 * NS, 0.1 * NS], [5 * NS, 0])):
        assert T._slot_store_choice(False, write, read) is False
        assert T._slot_store_choice(True, write, read) is True


def test_switches_on_the_sum_of_fill_and_copy_out():
    # Cached fills cheap but the reader's copies out of cached slots slow (the
    # slow placement): the sum decides, not one end alone.
    assert T._slot_store_choice(False, [0.05 * NS, 0.08 * NS], [0.30 * NS, 0.05 * NS]) is True
    # Only the reader's side slower, the writer's faster by as much: no switch.
    assert T._slot_store_choice(False, [0.02 * NS, 0.10 * NS], [0.10 * NS, 0.04 * NS]) is False
    # Back to cached once cached costs under 0.7x the streamed way.
    assert T._slot_store_choice(True, [0.02 * NS, 0.08 * NS], [0.03 * NS, 0.05 * NS]) is False


def test_hysteresis_keeps_the_current_way_between_the_bounds():
    # streamed at 0.8x cached: not enough to switch to it, not enough to leave it.
    write, read = [0.5 * NS, 0.4 * NS], [0.5 * NS, 0.4 * NS]
    assert T._slot_store_choice(False, write, read) is False
    assert T._slot_store_choice(True, write, read) is True
    # At 0.69x it switches; at 0.71x it does not.
    assert T._slot_store_choice(False, [1 * NS, 0.69 * NS], [1 * NS, 0.69 * NS]) is True
    assert T._slot_store_choice(False, [1 * NS, 0.71 * NS], [1 * NS, 0.71 * NS]) is False


def test_moving_average_and_its_cap_on_outliers():
    assert T._slot_cost_average(0.0, 2 * NS) == pytest.approx(2 * NS)  # the first sample sets it
    assert T._slot_cost_average(1 * NS, 2 * NS) == pytest.approx(1.125 * NS)  # 1/8 of the way
    # A preempted copy (1000x) counts as 4x: the average moves 3/8, not 125x.
    assert T._slot_cost_average(1 * NS, 1000 * NS) == pytest.approx(1.375 * NS)
    avg = 1 * NS
    for _ in range(60):
        avg = T._slot_cost_average(avg, 0.2 * NS)
    assert avg == pytest.approx(0.2 * NS, rel=1e-3)


def test_costs_a_peer_publishes_are_checked():
    assert T._slot_cost_from_bits(bits(0.5 * NS)) == pytest.approx(0.5 * NS)
    for garbage in (math.nan, math.inf, -math.inf, -1e-9, 0.0, 2.0, 1e300):
        assert T._slot_cost_from_bits(bits(garbage)) == 0.0, garbage
    assert T._slot_cost_from_bits(0xFFFFFFFFFFFFFFFF) == 0.0


def test_the_setting(monkeypatch):
    assert make_config().slot_stores == "auto"
    for value in ("auto", "cached", "streamed"):
        monkeypatch.setenv("RINGCOMM_SLOT_STORES", value)
        assert make_config().slot_stores == value
        assert T._slot_stores_mode(value) == ("auto", "cached", "streamed").index(value)
    monkeypatch.setenv("RINGCOMM_SLOT_STORES", "nontemporal")
    with pytest.raises(ValueError, match="RINGCOMM_SLOT_STORES"):
        make_config()
    with pytest.raises(ValueError, match="auto, cached, streamed"):
        T._slot_stores_mode("bogus")
