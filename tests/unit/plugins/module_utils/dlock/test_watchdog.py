import threading
import time

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.watchdog import Watchdog


def test_fires_once_its_time_is_up_and_says_so():
    dog, fired = Watchdog(), threading.Event()
    armed = time.monotonic()
    dog.arm(0.05, fired.set)
    assert fired.wait(5)
    assert time.monotonic() - armed >= 0.05
    assert dog.disarm() is True


def test_disarmed_in_time_it_never_fires_and_is_reusable():
    dog, calls = Watchdog(), []
    for _round in range(200):
        dog.arm(60, lambda: calls.append("late"))
        assert dog.disarm() is False
    fired = threading.Event()
    dog.arm(0.01, fired.set)  # the same thread serves the next operation
    assert fired.wait(5) and dog.disarm() is True
    assert calls == []


def test_a_slow_action_does_not_hold_up_disarm():
    dog, started, release = Watchdog(), threading.Event(), threading.Event()
    dog.arm(0.01, lambda: (started.set(), release.wait(5)))
    assert started.wait(5)
    begun = time.monotonic()
    assert dog.disarm() is True
    assert time.monotonic() - begun < 1.0
    release.set()


def test_the_last_resort_comes_a_grace_after_the_action_unless_disarmed_first():
    dog, calls, last = Watchdog(), [], threading.Event()
    armed = time.monotonic()
    dog.arm(0.02, lambda: calls.append("cancel"), then=(0.05, last.set))
    assert last.wait(5)
    assert time.monotonic() - armed >= 0.07 and calls == ["cancel"]
    assert dog.disarm() is True
    # Disarmed between the two: the last resort never runs, nor for the next arming.
    fired, late = threading.Event(), []
    dog.arm(0.01, fired.set, then=(0.2, lambda: late.append("shut down")))
    assert fired.wait(5) and dog.disarm() is True
    dog.arm(60, lambda: None)
    time.sleep(0.4)  # past the disarmed last resort's time: nothing to wait on, it must not come
    assert late == [] and dog.disarm() is False
