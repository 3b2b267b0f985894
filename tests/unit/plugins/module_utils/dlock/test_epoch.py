"""Fence epochs: the validation of fence_epoch and the composition of fences
(backends/epoch.py), on a stand-in backend (real backends and the Hypothesis
properties: tests/integration/test_fence_epoch.py)."""

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.base import Grant, LockView
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.epoch import EpochBackend, with_epoch
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError


class Counter(object):
    """A backend that grants with the counter it is given; records releases."""

    name = "stand-in"

    def __init__(self, counter):
        self.counter = counter
        self.released = []

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        return Grant("granted", self.counter, LockView(key, owner, self.counter))

    def query(self, key):
        return LockView(key, None, self.counter)

    def force_release(self, key):
        return LockView(key, "someone", self.counter)

    def release(self, key, owner, min_hold=0.0, last=None):
        self.released.append((key, owner))
        return True


def fence(epoch, counter):
    return with_epoch(Counter(counter), epoch).acquire("k", "o", 10).fence


@pytest.mark.parametrize("value", [0, 1, "7", 2 ** 13 - 1])
def test_an_epoch_is_a_whole_number_below_2_21(value):
    assert validate.fence_epoch(value) == int(value)


@pytest.mark.parametrize("value, words", [
    ("one", "'one' must be a whole number"), (True, "True must be a whole number"),
    (False, "False must be a whole number"), (float("nan"), "nan must be a whole number"),
    (1e308, "1e+308 must be a whole number"), (-1, "-1 is out of range (0-8191)"),
    (2 ** 13, "8192 is out of range (0-8191)"), ("1\n", "'1\\n' must be a whole number"),
    ("1\x00", "'1\\x00' must be a whole number"), (1.5, "1.5 must be a whole number"),
    (1.0, "1.0 must be a whole number"), (None, "None must be a whole number"), ([1], "[1] must be a whole number"),
    ("-1", "'-1' must be a whole number"), (" 1", "' 1' must be a whole number"),
])
def test_a_hostile_epoch_is_refused_naming_the_field(value, words):
    with pytest.raises(ConfigError) as err:
        validate.fence_epoch(value, "dlock.json: fence_epoch")
    assert str(err.value) == "dlock.json: fence_epoch: " + words
    with pytest.raises(ConfigError):
        with_epoch(Counter(1), value)


def test_epoch_0_is_the_backend_itself():
    backend = Counter(5)
    assert with_epoch(backend, 0) is backend and with_epoch(backend, "0") is backend


def test_every_fence_a_consumer_sees_carries_the_epoch():
    backend = with_epoch(Counter(5), 3)
    grant = backend.acquire("k", "o", 10)
    assert grant.fence == grant.holder.fence == 3 * 2 ** 40 + 5
    assert backend.query("k").fence == backend.force_release("k").fence == 3 * 2 ** 40 + 5
    assert backend.name == "stand-in"  # everything else is the backend's


def test_a_counter_that_reaches_the_next_epoch_is_refused_and_the_grant_given_back():
    inner = Counter(2 ** 40)
    backend = EpochBackend(inner, 1)
    with pytest.raises(ConfigError) as err:
        backend.acquire("k", "o", 10)
    assert "fence counter is 1099511627776, at or above 2**40: with fence_epoch 1" in str(err.value)
    assert "epoch 2" in str(err.value)
    assert inner.released == [("k", "o")]
    with pytest.raises(ConfigError):
        backend.query("k")
    assert with_epoch(Counter(2 ** 40), 0).acquire("k", "o", 10).fence == 2 ** 40  # epoch 0: as before epochs


@pytest.mark.parametrize("epoch, counter", [(0, 1), (1, 0), (1, 1), (2 ** 13 - 1, 2 ** 40 - 1)])
def test_fences_are_exact_in_json_up_to_the_last_epoch(epoch, counter):
    composed = fence(epoch, counter)
    assert composed < 2 ** 53 and float(composed) == composed
    assert divmod(composed, 2 ** 40) == (epoch, counter)
    # The order over the epochs' boundary (Hypothesis over all of them: tests/integration/test_fence_epoch.py).
    if epoch:
        assert fence(epoch - 1, 2 ** 40 - 1) < fence(epoch, 0)
