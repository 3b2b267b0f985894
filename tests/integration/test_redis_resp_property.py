"""The Redis protocol parser (backends/redis_resp.py): any reply, cut
anywhere, is incomplete until its last byte and then read back whole; a
hostile reply is a ValueError (the connection is then dropped), never a
wrong reply or a huge allocation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import redis_resp
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_resp import ReplyError, parse


def reply_bytes(value):
    """VALUE as a server would send it."""
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, ReplyError):
        return b"-%s\r\n" % str(value).encode()
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(reply_bytes(item) for item in value)
    data = value.encode("utf-8")
    return b"$%d\r\n%s\r\n" % (len(data), data)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)  # newlines and NULs included
ERRORS = st.from_regex(r"[A-Z]{2,9} [a-z ]{0,20}", fullmatch=True).map(ReplyError)
LEAVES = st.none() | st.integers(-2 ** 63, 2 ** 63 - 1) | TEXT | ERRORS
# Arrays up to three deep (the engine's replies nest two: EXEC of HMGET);
# redis_resp.MAX_DEPTH refuses deeper ones.
REPLIES = LEAVES | st.lists(LEAVES | st.lists(LEAVES | st.lists(LEAVES, max_size=4), max_size=4), max_size=5)


def same(a, b):
    if isinstance(a, ReplyError):
        return isinstance(b, ReplyError) and str(a) == str(b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@settings(max_examples=300, deadline=None)
@given(value=REPLIES, cut=st.integers(0, 10 ** 6), after=REPLIES)
def test_a_reply_cut_anywhere_waits_for_the_rest_and_then_reads_back_whole(value, cut, after):
    data = reply_bytes(value)
    cut %= len(data)
    assert parse(bytearray(data[:cut]))[0] is redis_resp._INCOMPLETE  # pylint: disable=protected-access
    buffer = bytearray(data + reply_bytes(after))  # the next reply right behind it
    read, end = parse(buffer)
    assert same(read, value) and end == len(data)
    assert same(parse(buffer, end)[0], after)


@pytest.mark.parametrize("hostile", [
    b"$9999999999\r\n",  # longer than Redis's largest string: no allocation of it
    b"$1e308\r\n", b"$NaN\r\n", b"*nan\r\n", b":12x\r\n",
    b"?what\r\n", b"\x00\r\n",
    b"$-5\r\n", b"*-2\r\n",  # -1 is nil; no other length is below 0
    b"*1\r\n" * 10 + b":1\r\n",  # arrays nested deeper than any reply of ours: never a RecursionError
])
def test_a_hostile_reply_is_refused(hostile):
    with pytest.raises(ValueError):
        parse(bytearray(hostile))
