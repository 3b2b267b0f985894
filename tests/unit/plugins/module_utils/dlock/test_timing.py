import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.child import exit_status
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.deadline import LeaseDeadline
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl, run_id, slot_number


def test_deadline_kills_strictly_before_expiry():
    d = LeaseDeadline(ttl=30, margin=0.6, kill_grace=5, sent_at=100.0)
    assert d.expires_at == 130.0
    assert d.kill_by == pytest.approx(129.4)
    assert d.terminate_at == pytest.approx(124.4)
    assert d.terminate_at < d.kill_by < d.expires_at


def test_deadline_moves_only_forward():
    d = LeaseDeadline(ttl=30, margin=0.6, kill_grace=5, sent_at=100.0)
    d.renewed(110.0)
    assert d.expires_at == 140.0
    d.renewed(105.0)  # a late answer to an older request
    assert d.expires_at == 140.0


@pytest.mark.parametrize("now,number", [
    (3600.0, 1), (3600 + 1799.9, 1), (3600 + 1800.0, 2), (3600 - 1800.0, 1), (3600 - 1800.1, 0),
])
def test_slot_is_the_nearest_boundary(now, number):
    assert slot_number(now, 3600) == number


def test_nodes_either_side_of_a_boundary_share_the_slot():
    boundary = 1_800_000_000 - 1_800_000_000 % 60
    fired = [boundary - 0.7, boundary, boundary + 12.3, boundary + 29.0]  # skew and randomized delay
    assert len({slot_number(t, 60) for t in fired}) == 1


def test_slot_marker_outlives_the_window_and_run_id_is_stable():
    assert marker_ttl(60) >= 60
    assert run_id("report", 29_000_000, 60, fence=7) == "report@2025-02-19T21:20:00Z"
    assert run_id("report", 29_000_000, 60, fence=8) == run_id("report", 29_000_000, 60, fence=7)
    assert run_id("report", None, None, fence=8) == "report#8"


def test_exit_status_uses_shell_convention():
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-15) == 143 and exit_status(-9) == 137
