"""Property tests (Hypothesis) of the validation core and of the backend
roles' templates.

- Every generated string holding a control character is refused by every
  text validator, every render filter and, for every role variable that takes
  a string, by the role's check (which names the variable).
- Accepted values round-trip: the canonical form of an accepted value is
  accepted again and unchanged.
- Every generated accepted dlock_redis setting renders (Ansible's own
  templating) a configuration the real redis-server starts with, and shows
  the intended values (CONFIG GET, ACL GETUSER, AUTH with the password).
- Every generated accepted dlock_postgresql client list, database and user
  render a pg_hba.conf that a real PostgreSQL reloads with pg_hba_file_rules
  showing exactly the intended rules: no error, the fixed methods only; its
  conf.d file is parsed by PostgreSQL with the intended values.
- Every generated accepted dlock_chrony setting renders a chrony.conf that
  chronyd -p reads, line for line as intended.
- Every generated accepted dlock_metrics setting renders refresh units that
  systemd-analyze verify accepts with the intended lines, and a node_exporter
  defaults file that a shell reads back as exactly the intended flags.

Example counts are bounded so the whole file stays well under two minutes.
"""

import hashlib
import ipaddress
import os
import re
import subprocess
import tempfile
import time

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_cli import ROOT
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import servers
from redis.backoff import NoBackoff
from redis.retry import Retry
from ansible_collections.dlock.fleet.plugins.filter import dlock_render
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules import chrony, metrics, postgresql
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules import redis as redis_rules
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules import runner as runner_rules
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.check import role_problems
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

CONTROL_CHARS = [chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7f, 0xa0)] + ["\u2028", "\u2029"]
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Servers are slow to start: few examples, and no long shrinking of a failure.
SERVER = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture],
                  phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])


@st.composite
def with_control(draw, base=st.text(max_size=40)):
    """A string with at least one control character somewhere in it."""
    text = draw(base)
    position = draw(st.integers(0, len(text)))
    return text[:position] + draw(st.sampled_from(CONTROL_CHARS)) + text[position:]


# Every validator of the core that takes text, with its other arguments.
TEXT_VALIDATORS = {
    "text": lambda v: validate.text(v, "f"),
    "job_name": lambda v: validate.job_name(v, "f"),
    "lock_key": lambda v: validate.lock_key(v, "f"),
    "env_name": lambda v: validate.env_name(v, "f"),
    "unix_name": lambda v: validate.unix_name(v, "f"),
    "unit_name": lambda v: validate.unit_name(v, "f"),
    "path": lambda v: validate.path(v, "f"),
    "address": lambda v: validate.address(v, "f"),
    "network": lambda v: validate.network(v, "f"),
    "hostname": lambda v: validate.hostname(v, "f"),
    "host_or_network": lambda v: validate.host_or_network(v, "f"),
    "duration": lambda v: validate.duration(v, "f"),
    "integer": lambda v: validate.integer(v, "f", 0, 10 ** 9),
    "fence_epoch": lambda v: validate.fence_epoch(v, "f"),
    "number": lambda v: validate.number(v, "f", 0, 10 ** 9),
    "choice": lambda v: validate.choice(v, "f", ("always", "no")),
    "backend_url": lambda v: validate.backend_url(v, "f"),
}
RENDER_FILTERS = {
    "dlock_unit_value": dlock_render.dlock_unit_value,
    "dlock_conf_token": dlock_render.dlock_conf_token,
    "dlock_pg_string": dlock_render.dlock_pg_string,
    "dlock_pg_address": dlock_render.dlock_pg_address,
    "dlock_conf_line": dlock_render.dlock_conf_line,
    "dlock_seconds": dlock_render.dlock_seconds,
}


@pytest.mark.parametrize("name", sorted(TEXT_VALIDATORS))
@FAST
@given(value=with_control())
def test_every_validator_refuses_control_characters(name, value):
    with pytest.raises(ConfigError):
        TEXT_VALIDATORS[name](value)


@pytest.mark.parametrize("name", sorted(RENDER_FILTERS))
@FAST
@given(value=with_control())
def test_every_render_filter_refuses_control_characters(name, value):
    with pytest.raises(AnsibleFilterError):
        RENDER_FILTERS[name](value, "f")


def _role_defaults(role):
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    defaults.pop("dlock_jobs_list", None)
    return defaults


# A valid setting of each role (the defaults, with their templates resolved).
GOOD = {
    "dlock_redis": dict(_role_defaults("dlock_redis"), dlock_redis_bind=["127.0.0.1"],
                        dlock_redis_password="p" * 16, dlock_redis_url_host="db1"),
    "dlock_postgresql": dict(_role_defaults("dlock_postgresql"), dlock_postgresql_listen_addresses=["localhost"],
                             dlock_postgresql_password="p" * 16, dlock_postgresql_clients=["10.0.0.0/8"],
                             dlock_postgresql_url_host="db1", dlock_postgresql_ha_name="db1",
                             dlock_postgresql_ha_address="", dlock_postgresql_ha_data_dir="/var/lib/pg/patroni",
                             dlock_postgresql_ha_etcd_endpoints=["http://10.0.0.1:2379"]),
    "dlock_chrony": dict(_role_defaults("dlock_chrony"), dlock_chrony_container_mode=False,
                         dlock_chrony_slew_only=False),
    "dlock_metrics": dict(_role_defaults("dlock_metrics"), dlock_metrics_textfile_dir="/var/lib/ne",
                          dlock_metrics_runner_bin="/usr/local/bin/dlock", dlock_metrics_group="dlock",
                          dlock_metrics_jobs_dir="/etc/dlock/jobs", dlock_metrics_password_path="/etc/dlock/pw"),
    "dlock_runner": dict(_role_defaults("dlock_runner"), dlock_runner_backend_url="redis://dlock@db1:6379/0",
                         dlock_runner_backend_password="", dlock_runner_ca_file="", dlock_runner_fence_epoch=0),
    "dlock_jobs": dict(_role_defaults("dlock_jobs"), dlock_jobs_runner_bin="/usr/local/bin/dlock",
                       dlock_jobs_jobs_dir="/etc/dlock/jobs", dlock_jobs_group="dlock",
                       dlock_jobs_password_path="/etc/dlock/pw", dlock_jobs_metrics_dir="",
                       dlock_jobs_backend_url=""),
}
STRING_VARIABLES = sorted((role, name) for role, values in GOOD.items() for name, value in values.items()
                          if isinstance(value, str))
LIST_VARIABLES = sorted((role, name) for role, values in GOOD.items() for name, value in values.items()
                        if isinstance(value, list))


def test_the_good_settings_are_good():
    for role, values in GOOD.items():
        assert role_problems(values, role) == [], role


@pytest.mark.parametrize("role, name", STRING_VARIABLES)
@settings(max_examples=30, deadline=None)
@given(value=with_control())
def test_every_string_role_variable_refuses_control_characters(role, name, value):
    problems = role_problems(dict(GOOD[role], **{name: value}), role)
    assert problems and any(p.startswith(name) for p in problems), problems
    if name.endswith("password"):
        assert not any(value in p for p in problems)


@pytest.mark.parametrize("role, name", LIST_VARIABLES)
@settings(max_examples=20, deadline=None)
@given(value=with_control())
def test_every_list_role_variable_refuses_control_characters_and_strings(role, name, value):
    for bad in ([value], value):  # in an item, and a string where the list belongs
        problems = role_problems(dict(GOOD[role], **{name: bad}), role)
        assert problems and any(p.startswith(name) for p in problems), problems


@settings(max_examples=100, deadline=None)
@given(value=st.text(min_size=16, max_size=64))
def test_a_password_is_never_in_a_message(value):
    """Whatever the password, good or bad, no message shows it."""
    for role, name in (("dlock_redis", "dlock_redis_password"), ("dlock_postgresql", "dlock_postgresql_password"),
                       ("dlock_postgresql", "dlock_postgresql_ha_replication_password"),
                       ("dlock_postgresql", "dlock_postgresql_ha_restapi_password"),
                       ("dlock_runner", "dlock_runner_backend_password")):
        for problem in role_problems(dict(GOOD[role], **{name: value}), role):
            assert value not in problem and value.strip()[:12] not in problem


# -- fence epochs: the runner's check and its guard against fences that go back ---
EPOCHS = st.integers(0, validate.MAX_FENCE_EPOCH)
# Small epochs as well: equal and neighbouring epochs are where the guard decides.
NEAR_EPOCHS = st.one_of(st.integers(0, 3), EPOCHS)
COUNTERS = st.integers(1, 2 ** 40 - 1)  # what a backend's grant issues
# The etcd cluster of db1, db2 and of db1, db2, db3 after a member joined
# is one backend (its revision goes on): epoch.same_backend.
GROWN = ("etcd://dlock@db1:2379,db2:2379/dlock", "etcd://dlock@db1:2379,db2:2379,db3:2379/dlock")
BACKENDS = st.sampled_from(["redis://dlock@db1:6379/0", "redis://db1/1", "postgresql://dlock@db1/dlock",
                            "postgresql+advisory://dlock@db1/dlock", "etcd://dlock@db7:2379,db8:2379/dlock",
                            "file:///var/lib/dlock"] + list(GROWN))


@FAST
@given(epoch=st.one_of(EPOCHS, EPOCHS.map(str)), counter=COUNTERS)
def test_every_epoch_the_runner_accepts_keeps_its_fences_exact_for_json(epoch, counter):
    assert role_problems(dict(GOOD["dlock_runner"], dlock_runner_fence_epoch=epoch), "dlock_runner") == []
    fence = validate.fence_epoch(epoch) * 2 ** 40 + counter
    assert fence < 2 ** 53 and float(fence) == fence


@FAST
@given(epoch=st.one_of(st.integers(max_value=-1), st.integers(min_value=validate.MAX_FENCE_EPOCH + 1),
                       st.floats(), st.booleans(), st.text().filter(lambda t: not re.fullmatch(r"[0-9]{1,7}", t))))
def test_every_epoch_out_of_bounds_or_of_another_type_is_refused_by_the_runners_check(epoch):
    problems = role_problems(dict(GOOD["dlock_runner"], dlock_runner_fence_epoch=epoch), "dlock_runner")
    assert problems and all(p.startswith("dlock_runner_fence_epoch: ") for p in problems), problems


@FAST
@given(old=BACKENDS, new=BACKENDS, e1=NEAR_EPOCHS, e2=NEAR_EPOCHS, c1=st.integers(1, 2 ** 40 - 2))
def test_the_guard_lets_through_exactly_the_changes_whose_fences_go_forward(old, new, e1, e2, c1):
    """Installed: backend OLD at epoch e1, whose last fence was e1 * 2**40 +
    c1. The guard accepts NEW at e2 exactly when the first fence the node
    then hands out is above that one: another backend counts from 1 again,
    the same one goes on from c1."""
    installed = '{"backend": "%s", "fence_epoch": %d}' % (old, e1)
    accepted = runner_rules.fence_switch_problems(installed, "/etc/dlock/dlock.json", new, e2) == []
    same = old == new or {old, new} == set(GROWN)
    first_new = e2 * 2 ** 40 + (c1 + 1 if same else 1)
    assert accepted == (first_new > e1 * 2 ** 40 + c1), (old, new, e1, e2)


# -- round trips --------------------------------------------------------------
SEGMENT = st.from_regex(r"[A-Za-z0-9_,:+@=~-][A-Za-z0-9_.,:+@=~-]{0,15}", fullmatch=True).filter(
    lambda s: s not in (".", ".."))
PATHS = st.lists(SEGMENT, min_size=0, max_size=6).map(lambda parts: "/" + "/".join(parts))
LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
HOSTNAMES = st.lists(LABEL, min_size=1, max_size=4).map(".".join).filter(
    lambda h: not h.replace(".", "").isdigit() and h.lower() not in postgresql.PG_HBA_KEYWORDS)
ADDRESSES = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)


@st.composite
def networks(draw):
    address = ipaddress.ip_address(draw(ADDRESSES))
    prefix = draw(st.integers(0, address.max_prefixlen))
    return str(ipaddress.ip_network("%s/%d" % (address, prefix), strict=False))


@FAST
@given(path=PATHS)
def test_accepted_paths_round_trip(path):
    assert validate.path(path, "f") == path


@FAST
@given(value=st.one_of(ADDRESSES, networks()))
def test_accepted_networks_are_canonical_and_round_trip(value):
    canonical = validate.network(value, "f")
    assert validate.network(canonical, "f") == canonical
    assert ipaddress.ip_network(canonical) == ipaddress.ip_network(value)
    assert dlock_render.dlock_pg_address(value) == canonical


@FAST
@given(value=st.one_of(ADDRESSES, HOSTNAMES))
def test_accepted_host_names_round_trip(value):
    assert validate.hostname(validate.hostname(value, "f"), "f") == validate.hostname(value, "f")


@FAST
@given(seconds=st.integers(1, int(validate.MAX_DURATION)))
def test_accepted_durations_round_trip(seconds):
    assert validate.duration(validate.format_duration(seconds), "f") == seconds
    assert validate.duration(str(seconds), "f") == seconds


@FAST
@given(milliseconds=st.integers(1, 10 ** 9))
def test_seconds_are_the_engines_duration_rounded_up(milliseconds):
    """dlock_seconds (drain's timeout(1)) reads what the engine reads and
    never waits less: whole seconds, at least the duration."""
    value = "%dms" % milliseconds
    seconds = dlock_render.dlock_seconds(value)
    assert seconds - 1 < validate.duration(value, "f") <= seconds
    assert dlock_render.dlock_seconds(validate.format_duration(seconds)) == seconds


@pytest.mark.parametrize("value", ["NaN", 1e308, float("nan"), "-1s", "1h\n", "1h\x00", ["1h"], True, "5 minutes"])
def test_seconds_refuse_what_the_engine_refuses(value):
    with pytest.raises(AnsibleFilterError):
        dlock_render.dlock_seconds(value, "dlock_jobs_drain_timeout")


@FAST
@given(number=st.integers(1, 65535))
def test_ports_as_digit_strings_are_ports(number):
    assert validate.port(str(number), "f") == validate.port(number, "f") == number


# -- the templates, rendered by Ansible, read by the real servers -------------
REDIS_USER = st.from_regex(redis_rules.REDIS_USER, fullmatch=True).filter(lambda u: u != "default")
# Passwords: any characters but white space and control characters, 16+.
PASSWORD = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"),
                                 blacklist_characters="\x85\u180e\u200b\ufeff"), min_size=16, max_size=40).filter(
    lambda p: re.fullmatch(r"\S+", p))
MEMORY = st.one_of(st.just(""), st.integers(0, redis_rules.MAX_MEMORY),
                   st.tuples(st.integers(0, 10 ** 6), st.sampled_from(["", "b", "k", "KB", "m", "mb", "g", "Gb"]))
                   .map(lambda t: "%d%s" % t))


@st.composite
def redis_settings(draw):
    user = draw(REDIS_USER)
    admin = draw(REDIS_USER.filter(lambda a: a != user))
    port = draw(st.integers(1, 65535))
    return {
        "dlock_redis_bind": draw(st.lists(ADDRESSES, min_size=1, max_size=4, unique=True)),
        "dlock_redis_port": draw(st.sampled_from([port, str(port)])),
        "dlock_redis_user": user,
        "dlock_redis_password": draw(PASSWORD),
        "dlock_redis_admin_user": admin,
        "dlock_redis_admin_password": draw(st.one_of(st.just(""), PASSWORD)),
        "dlock_redis_appendfsync": draw(st.sampled_from(["always", "everysec", "no"])),
        "dlock_redis_maxmemory": draw(MEMORY),
        "dlock_redis_tls": False,
        "dlock_redis_tls_cert_file": draw(st.one_of(st.just(""), PATHS)),
        "dlock_redis_tls_key_file": draw(st.one_of(st.just(""), PATHS)),
        "dlock_redis_tls_ca_file": draw(st.one_of(st.just(""), PATHS)),
        "dlock_redis_tls_auth_clients": draw(st.booleans()),
        "dlock_redis_url_host": draw(st.one_of(ADDRESSES, HOSTNAMES)),
    }


PROBE_PASSWORD = "probe-for-the-test-only"


def _start_redis(conf_dir, conf):
    """redis-server on the rendered file, and after it (so it wins) TCP
    closed (port 0), a unix socket, and a probe user for the test to read the
    settings with; (process, socket path)."""
    socket_path = os.path.join(conf_dir, "redis.sock")
    proc = subprocess.Popen(["redis-server", conf, "--port", "0", "--unixsocket", socket_path, "--dir", conf_dir,
                             "--daemonize", "no", "--save", "",
                             "--user", "dlock-test-probe", "on", ">" + PROBE_PASSWORD, "~*", "&*", "+@all"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import redis
    probe = redis.Redis(unix_socket_path=socket_path, username="dlock-test-probe", password=PROBE_PASSWORD,
                        socket_timeout=5, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise AssertionError("redis-server refused the configuration:\n" + proc.stdout.read())
        try:
            probe.ping()
            return proc, socket_path
        except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("redis-server did not answer on its socket")
            time.sleep(0.02)


@SERVER
@given(values=redis_settings())
def test_every_accepted_redis_setting_renders_a_config_redis_starts_with(render, values):
    import redis
    assert role_problems(values, "dlock_redis") == []
    text = render("dlock_redis", "dlock.conf.j2", dict(values, __dlock_redis_platform={"config": "/etc/redis.conf"}))
    with tempfile.TemporaryDirectory(prefix="dlock-redis-prop-") as tmp:
        conf = os.path.join(tmp, "dlock.conf")
        with open(conf, "w") as handle:
            handle.write(text)
        proc, socket_path = _start_redis(tmp, conf)
        try:
            def client(username=None, password=None):
                # No retries: redis-py retries an AuthenticationError (a
                # ConnectionError) with backoff by default.
                return redis.Redis(unix_socket_path=socket_path, decode_responses=True, username=username,
                                   password=password, socket_timeout=10, retry=Retry(NoBackoff(), 0))
            probe = client("dlock-test-probe", PROBE_PASSWORD)
            config = dict((name, probe.config_get(name)[name])
                          for name in ("bind", "appendfsync", "maxmemory-policy", "appendonly", "maxmemory"))
            assert config["bind"] == " ".join(values["dlock_redis_bind"])
            assert config["appendfsync"] == values["dlock_redis_appendfsync"]
            assert (config["maxmemory-policy"], config["appendonly"]) == ("noeviction", "yes")
            if values["dlock_redis_maxmemory"] != "":
                assert int(config["maxmemory"]) == redis_rules.redis_memory_bytes(values["dlock_redis_maxmemory"])
            users = {"default", values["dlock_redis_user"], "dlock-test-probe"}
            if values["dlock_redis_admin_password"]:
                users.add(values["dlock_redis_admin_user"])
                assert client(values["dlock_redis_admin_user"], values["dlock_redis_admin_password"]).ping()
            assert set(probe.acl_users()) == users
            # The runners' user logs in with its password, and reaches only
            # the lock keys with only the engine's commands.
            runner = client(values["dlock_redis_user"], values["dlock_redis_password"])
            assert runner.time() and runner.exists("dlock:x") == 0
            with pytest.raises(redis.exceptions.NoPermissionError):
                runner.get("other:key")
            with pytest.raises(redis.exceptions.NoPermissionError):
                runner.config_get("bind")
            # Nobody gets in without a password (default has none).
            with pytest.raises(redis.exceptions.AuthenticationError):
                client().ping()
        finally:
            proc.kill()
            proc.wait(10)


PG_NAME = st.from_regex(postgresql.SQL_NAME, fullmatch=True).filter(
    lambda n: n not in postgresql.PG_HBA_NAME_KEYWORDS)
PG_USER = PG_NAME.filter(lambda n: n not in ("postgres", "public") and not n.startswith("pg_"))
CLIENTS = st.lists(st.one_of(ADDRESSES, networks(), HOSTNAMES), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def pg_hba_server():
    """A throwaway PostgreSQL whose pg_hba.conf the test rewrites; the test
    keeps one connection (made before any rewrite) to reload and read it."""
    server = servers.PostgresServer()
    conn = server.connect(db="postgres")
    original = open(os.path.join(server.data, "pg_hba.conf")).read()
    yield server, conn
    with open(os.path.join(server.data, "pg_hba.conf"), "w") as handle:
        handle.write(original)
    conn.close()
    server.stop()


def _expected_row(client):
    """(address, netmask) of pg_hba_file_rules for one accepted client."""
    try:
        network = ipaddress.ip_network(client if "/" in client else ipaddress.ip_address(client))
    except ValueError:
        return client, None
    return network.network_address, network.netmask


@SERVER
@given(clients=CLIENTS, database=PG_NAME, user=PG_USER)
def test_every_accepted_pg_client_list_loads_with_only_the_intended_rules(render, pg_hba_server, clients, database,
                                                                          user):
    server, conn = pg_hba_server
    values = dict(GOOD["dlock_postgresql"], dlock_postgresql_clients=clients, dlock_postgresql_database=database,
                  dlock_postgresql_user=user)
    assert role_problems(values, "dlock_postgresql") == []
    text = render("dlock_postgresql", "pg_hba.conf.j2", values)
    with open(os.path.join(server.data, "pg_hba.conf"), "w") as handle:
        handle.write(text)
    assert conn.execute("SELECT pg_reload_conf()").fetchone()[0] is True
    rows = conn.execute("SELECT type, database, user_name, address, netmask, auth_method, options, error "
                        "FROM pg_hba_file_rules ORDER BY line_number").fetchall()
    assert [row[7] for row in rows] == [None] * len(rows), rows
    assert rows[0][:3] == ("local", ["all"], ["postgres"]) and rows[0][5] == "peer"
    got = [(row[0], row[1], row[2], row[5], row[6]) for row in rows[1:]]
    assert got == [("host", [database], [user], "scram-sha-256", None)] * len(clients)
    for row, client in zip(rows[1:], clients):
        address, netmask = _expected_row(client)
        if netmask is None:
            assert (row[3], row[4]) == (address, None)
        else:
            assert ipaddress.ip_address(row[3]) == address and ipaddress.ip_address(row[4]) == netmask


@settings(SERVER, max_examples=15)
@given(addresses=st.lists(st.one_of(st.just("*"), st.just("localhost"), ADDRESSES, HOSTNAMES), min_size=1,
                          max_size=4),
       timeout=st.tuples(st.integers(0, 3600), st.sampled_from(["s", "min", "ms", ""]))
       .filter(lambda t: t[0] * {"s": 1, "min": 60, "ms": 0.001, "": 0.001}[t[1]] <= 3600)
       .map(lambda t: "%d%s" % t))
def test_every_accepted_pg_setting_renders_a_conf_postgres_reads(render, pg_hba_server, addresses, timeout):
    """The conf.d file: PostgreSQL parses it (pg_file_settings has no error)
    with the intended values."""
    server, conn = pg_hba_server
    values = dict(GOOD["dlock_postgresql"], dlock_postgresql_listen_addresses=addresses,
                  dlock_postgresql_tcp_user_timeout=timeout)
    assert role_problems(values, "dlock_postgresql") == []
    text = render("dlock_postgresql", "dlock.conf.j2", values)
    path = os.path.join(server.dir, "dlock-test.conf")
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o644)
    rows = _parse_conf(conn, path)
    # Server-start settings (listen_addresses, port) "could not be applied"
    # without a restart; anything else, a syntax error above all, is wrong.
    assert [(name, error) for name, _s, error in rows if error not in (None, "setting could not be applied")
            or name is None] == [], rows
    assert [name for name, _s, error in rows if error] in ([], ["listen_addresses", "port"],
                                                           ["listen_addresses"], ["port"])
    settings_ = dict((name, setting) for name, setting, error in rows)
    assert sorted(settings_) == sorted(["listen_addresses", "port", "password_encryption", "tcp_keepalives_idle",
                                        "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout",
                                        "client_connection_check_interval"])
    assert settings_["listen_addresses"] == ",".join(addresses)
    assert settings_["tcp_user_timeout"] == timeout


def _parse_conf(conn, path):
    """PostgreSQL's own parser on the file: include it from a scratch file
    and read pg_file_settings (which lists what the files say, not applied)."""
    data = conn.execute("SHOW data_directory").fetchone()[0]
    auto = os.path.join(data, "postgresql.auto.conf")
    original = open(auto).read()
    try:
        with open(auto, "w") as handle:
            handle.write(original + "\ninclude '%s'\n" % path)
        return conn.execute("SELECT name, setting, error FROM pg_file_settings WHERE sourcefile = %s "
                            "ORDER BY seqno", (path,)).fetchall()
    finally:
        with open(auto, "w") as handle:
            handle.write(original)


def test_the_sha256_in_the_redis_acl_is_of_the_password(render):
    """The ACL line holds the password's SHA-256 and never the password."""
    values = dict(GOOD["dlock_redis"], dlock_redis_password="Pw-5ecret-for-acl-1")
    text = render("dlock_redis", "dlock.conf.j2", dict(values, __dlock_redis_platform={"config": "/x"}))
    assert "#" + hashlib.sha256(b"Pw-5ecret-for-acl-1").hexdigest() in text
    assert "Pw-5ecret" not in text


@st.composite
def source_options(draw):
    words = []
    for _index in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flag", "integer", "number"]))
        if kind == "flag":
            words.append(draw(st.sampled_from(chrony.CHRONY_FLAGS)))
        elif kind == "integer":
            name = draw(st.sampled_from(sorted(chrony.CHRONY_INTEGER_OPTIONS)))
            words += [name, str(draw(st.integers(*chrony.CHRONY_INTEGER_OPTIONS[name])))]
        else:
            words += [draw(st.sampled_from(chrony.CHRONY_NUMBER_OPTIONS)),
                      "%.3f" % draw(st.floats(0, 10, allow_nan=False, allow_infinity=False))]
    return " ".join(words)


@st.composite
def chrony_settings(draw):
    values = dict(GOOD["dlock_chrony"])
    values.update({
        "dlock_chrony_servers": draw(st.lists(st.one_of(ADDRESSES, HOSTNAMES), max_size=3)),
        "dlock_chrony_pools": draw(st.lists(HOSTNAMES, max_size=2)),
        "dlock_chrony_source_options": draw(source_options()),
        "dlock_chrony_makestep_threshold": draw(st.one_of(
            st.floats(0.001, 86400, allow_nan=False), st.integers(1, 86400),
            st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,6})?", fullmatch=True).filter(lambda v: float(v) >= 0.001))),
        "dlock_chrony_makestep_limit": draw(st.integers(1, 1000)),
        "dlock_chrony_slew_only": draw(st.booleans()),
        "dlock_chrony_maxslewrate": draw(st.one_of(st.floats(1, 10000, allow_nan=False), st.integers(1, 10000))),
        "dlock_chrony_allow": draw(st.lists(networks(), max_size=3)),
        "dlock_chrony_local_stratum": draw(st.integers(0, 15)),
        "dlock_chrony_local_orphan": draw(st.booleans()),
        "dlock_chrony_container_mode": draw(st.booleans()),
        "dlock_chrony_extra_config": draw(st.lists(st.sampled_from(
            ["hwtimestamp *", "maxdistance 16.0", "logchange 0.5", "cmdport 0", "minsources 2"]), max_size=3)),
    })
    if not (values["dlock_chrony_servers"] or values["dlock_chrony_pools"]) or values["dlock_chrony_local_orphan"]:
        values["dlock_chrony_local_stratum"] = draw(st.integers(1, 15))
    return values


@SERVER
@given(values=chrony_settings())
def test_every_accepted_chrony_setting_renders_a_config_chronyd_reads(render, values):
    """chronyd -p (parse the configuration, print it, exit) takes the file and
    reads exactly the intended lines."""
    assert role_problems(values, "dlock_chrony") == []
    platform = {"driftfile": "/var/lib/chrony/chrony.drift", "logdir": "/var/log/chrony",
                "keyfile": "/etc/chrony/chrony.keys"}
    text = render("dlock_chrony", "chrony.conf.j2", dict(values, __dlock_chrony_platform=platform))
    with tempfile.TemporaryDirectory(prefix="dlock-chrony-prop-") as tmp:
        conf = os.path.join(tmp, "chrony.conf")
        with open(conf, "w") as handle:
            handle.write(text)
        proc = subprocess.run(["chronyd", "-p", "-f", conf], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr + text
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert proc.stdout.splitlines() == lines
    options = values["dlock_chrony_source_options"]
    assert [line for line in lines if line.startswith(("server ", "pool "))] == (
        [("server %s %s" % (s, options)).strip() for s in values["dlock_chrony_servers"]]
        + [("pool %s %s" % (p, options)).strip() for p in values["dlock_chrony_pools"]])
    assert [line for line in lines if line.startswith("allow ")] == [
        "allow " + network for network in values["dlock_chrony_allow"]]
    # A slew-only host (a backend's) never steps: no makestep, a bounded slew.
    steps = [line for line in lines if line.startswith("makestep ")]
    slews = [line for line in lines if line.startswith("maxslewrate ")]
    if values["dlock_chrony_slew_only"]:
        assert steps == [] and len(slews) == 1 and float(slews[0].split()[1]) <= 10000
    else:
        assert len(steps) == 1 and slews == []
    local = [line for line in lines if line.startswith("local ")]
    stratum = values["dlock_chrony_local_stratum"]
    assert local == ([("local stratum %d %s" % (stratum, "orphan" if values["dlock_chrony_local_orphan"] else "")
                       ).strip()] if stratum else [])


USER_NAME = st.from_regex(r"[a-z_][a-z0-9_-]{0,20}", fullmatch=True).filter(lambda u: u != "root")
EXPORTER_FLAGS = st.lists(st.from_regex(r"--[a-z0-9][a-z0-9._-]{0,20}(=[A-Za-z0-9_.,:/@+=~*-]{0,20})?",
                                        fullmatch=True).filter(
    lambda f: f.split("=", 1)[0] not in metrics.EXPORTER_OWN_FLAGS), max_size=4)


@st.composite
def metrics_settings(draw):
    port = draw(st.integers(1, 65535))
    host = draw(st.one_of(st.just(""), st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map("[{}]".format),
                          HOSTNAMES))
    return dict(GOOD["dlock_metrics"], **{
        "dlock_metrics_textfile_dir": draw(PATHS),
        "dlock_metrics_listen_address": "%s:%d" % (host, port),
        "dlock_metrics_node_exporter_args": draw(EXPORTER_FLAGS),
        "dlock_metrics_refresh_interval": draw(st.one_of(
            st.integers(1, 86400), st.tuples(st.integers(1, 1440), st.sampled_from(["s", "m", ""])).map(
                lambda t: "%d%s" % t))),
        "dlock_metrics_refresh_user": draw(USER_NAME),
        "dlock_metrics_runner_bin": "/bin/true",  # systemd-analyze verify wants an executable
        "dlock_metrics_group": draw(USER_NAME),
        "dlock_metrics_jobs_dir": draw(PATHS),
        "dlock_metrics_password_path": draw(PATHS),
        "dlock_metrics_unit_dir": draw(PATHS),
    })


@settings(SERVER, max_examples=10)
@given(values=metrics_settings())
def test_every_accepted_metrics_setting_renders_units_systemd_accepts(render, values):
    """The refresh units pass systemd-analyze verify with the intended lines;
    the node_exporter defaults file, read by a shell, gives the intended flags."""
    assert role_problems(values, "dlock_metrics") == []
    variables = dict(values, __dlock_metrics_platform={"args_variable": "ARGS"},
                     __dlock_metrics_password={"stat": {"exists": True}},
                     __dlock_metrics_textfile=values["dlock_metrics_textfile_dir"] + "/dlock-lock-state.prom")
    with tempfile.TemporaryDirectory(prefix="dlock-metrics-prop-") as tmp:
        units = {}
        for kind in ("service", "timer"):
            units[kind] = render("dlock_metrics", "refresh.%s.j2" % kind, variables)
            with open(os.path.join(tmp, "prometheus-node-exporter-dlock." + kind), "w") as handle:
                handle.write(units[kind])
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no",
                               os.path.join(tmp, "prometheus-node-exporter-dlock.service"),
                               os.path.join(tmp, "prometheus-node-exporter-dlock.timer")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        defaults = os.path.join(tmp, "defaults")
        with open(defaults, "w") as handle:
            handle.write(render("dlock_metrics", "node-exporter.defaults.j2", variables))
        shell = subprocess.run(["/bin/sh", "-c", '. "$1" && printf %s "$ARGS"', "sh", defaults],
                               capture_output=True, text=True, timeout=30, check=False)
    assert shell.returncode == 0 and shell.stderr == "", shell.stderr
    assert shell.stdout.split(" ") == (["--web.listen-address=" + values["dlock_metrics_listen_address"],
                                        "--collector.textfile.directory=" + values["dlock_metrics_textfile_dir"]]
                                       + values["dlock_metrics_node_exporter_args"])
    service = units["service"].splitlines()
    assert ("ExecStart=/bin/true metrics --jobs-dir %s --unit-dir %s --output %s/dlock-lock-state.prom"
            % (values["dlock_metrics_jobs_dir"], values["dlock_metrics_unit_dir"],
               values["dlock_metrics_textfile_dir"])) in service
    assert "User=%s" % values["dlock_metrics_refresh_user"] in service
    assert "SupplementaryGroups=%s" % values["dlock_metrics_group"] in service
    assert "OnUnitActiveSec=%s" % values["dlock_metrics_refresh_interval"] in units["timer"].splitlines()
