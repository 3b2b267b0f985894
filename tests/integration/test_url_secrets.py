"""A password in a backend URL is refused before anything else is checked,
and no message or log line shows it, whatever characters it holds: the
URL's own separators ('/', '?', '#', '@', ':') included, which once moved it
out of the user part, past the check, into an echoed path or query."""

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

SCHEMES = [scheme for scheme in validate.SCHEMES if scheme != "file"]
TAILS = {"redis": "h:6379/0", "rediss": "h:6380/0", "postgresql": "h1:5432,h2/dlock",
         "postgresql+advisory": "h/dlock", "etcd": "h1:2379,h2:2379/dlock", "etcd+https": "h:2379/dlock"}
# Every printable character, the separators first (Hypothesis shrinks towards them).
PRINTABLE = "/?#@:&;=%" + string.ascii_letters + string.digits + string.punctuation + " \u00e9\u2028"
PASSWORDS = st.text(alphabet=PRINTABLE, min_size=1, max_size=40).map(lambda tail: "Pw-5ecret" + tail)


def refusal(url):
    with pytest.raises(ConfigError) as err:
        validate.backend_url(url, "backend")
    return str(err.value)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("password", ["Pw-5ecret/0", "Pw-5ecret?x=1", "Pw-5ecret#frag", "Pw-5ecret@x",
                                      "Pw-5ecret:with:colons", "Pw-5ecret/a?b#c@d"])
def test_a_password_with_the_urls_separators_is_refused_and_never_shown(scheme, password):
    url = "%s://dlock:%s@%s" % (scheme, password, TAILS[scheme])
    message = refusal(url)
    assert "contains a password" in message
    assert "Pw-5ecret" not in message and "Pw-5ecret" not in validate.redact_url(url)


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), password=PASSWORDS, user=st.sampled_from(["dlock", "", "u.x-1"]))
def test_a_password_in_the_user_part_is_never_in_a_message(scheme, password, user):
    url = "%s://%s:%s@%s" % (scheme, user, password, TAILS[scheme])
    message = refusal(url)
    assert "contains a password" in message, message
    assert "Pw-5ecret" not in message and "Pw-5ecret" not in validate.redact_url(url)


@settings(max_examples=200, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), password=PASSWORDS, name=st.sampled_from(["password", "sslpassword", "PASS"]))
def test_a_password_in_the_query_is_never_in_a_message(scheme, password, name):
    url = "%s://dlock@%s?%s=%s" % (scheme, TAILS[scheme], name, password)
    message = refusal(url)
    assert "Pw-5ecret" not in message and "Pw-5ecret" not in validate.redact_url(url)


@pytest.mark.parametrize("url", [
    # An '@' in a query value, after a user@host:port: no password there.
    "postgresql://dlock@h:5432/dlock?sslrootcert=/etc/ssl/a@b.pem",
    "etcd+https://dlock@h1:2379,h2:2379/dlock?cert=/etc/dlock/c@1.pem&key=/etc/dlock/k.pem",
])
def test_an_at_sign_after_the_host_is_no_password(url):
    try:
        validate.backend_url(url, "backend")
    except ConfigError as err:
        assert "contains a password" not in str(err)
    assert validate.redact_url(url) == url
