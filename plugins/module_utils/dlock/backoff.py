"""Waiting for a busy lock: exponential backoff with jitter and a cap."""

import random

BASE_DELAY = 0.1


def backoff_delay(attempt, cap, rng=random):
    """Delay before retry number `attempt` (1-based): half of min(cap, base*2^(n-1))
    plus a random part up to the other half, so waiters spread out but still
    retry within the capped interval."""
    ceiling = min(cap, BASE_DELAY * (2 ** min(attempt - 1, 30)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def backoff_cap(ttl):
    """Retry at least every few seconds, and often compared to short leases."""
    return max(BASE_DELAY, min(5.0, ttl / 4))
