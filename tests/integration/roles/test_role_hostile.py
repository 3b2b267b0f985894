"""Hostile input for every role variable, run for real: ansible-playbook with
-vvv against local hosts, one host alias per case (its own bad hostvars), the
role's preflight, then the role's templates rendered into a temp directory.

Each case asserts: the host fails at the role's check of its settings (the
run ends with rc 2), the message names the variable, no traceback, no
password of any case anywhere in the output, and nothing rendered for that
host. A good host per role (in the same run, or in test_good_settings_get_through)
shows that the same plays do render when the settings are good, so "nothing
rendered" means something.

Many cases per ansible-playbook run keep this fast: the backend, chrony and
metrics cases share one run; the runner's and the jobs role's preflights stop
every host at the first failure (any_errors_fatal), so each has a run of its
own. Facts (os_family) come from a fact cache filled once from a real
`setup` of localhost, so no case gathers facts.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from ansible_cli import BIN, ROOT, ansible_env

# The test passwords: none may appear in any output, whatever the case; every
# one (and every piece of one a case uses) holds MARK.
MARK = "Pw-5ecret"
SECRET_REDIS = "Redis-Pw-5ecret-0001"
SECRET_ADMIN = "Admin-Pw-5ecret-0002"
SECRET_PG = "Pg-Pw-5ecret-00003"
SECRET_RUNNER = "Runner-Pw-5ecret-04"
SECRET_URL = "Url-Pw-5ecret-0005"
SECRET_ETCD_ROOT = "Root-Pw-5ecret-006"
SECRET_ETCD = "Etcd-Pw-5ecret-0007"

BASE = {
    "dlock_redis": {"dlock_redis_password": SECRET_REDIS, "dlock_redis_admin_password": SECRET_ADMIN,
                    "dlock_redis_bind": ["127.0.0.1"]},
    "dlock_postgresql": {"dlock_postgresql_password": SECRET_PG, "dlock_postgresql_clients": ["10.0.0.0/24"],
                         "dlock_postgresql_listen_addresses": ["localhost"]},
    # Each etcd host is a one-member cluster of its own (run_cases makes the group).
    "dlock_etcd": {"dlock_etcd_root_password": SECRET_ETCD_ROOT, "dlock_etcd_password": SECRET_ETCD,
                   "dlock_etcd_address": "127.0.0.1", "dlock_etcd_group": "{{ 'etcd_' ~ inventory_hostname | replace('-', '_') }}"},
    "dlock_chrony": {},
    "dlock_metrics": {"dlock_metrics_group": "root"},
    "dlock_runner": {"dlock_runner_backend_url": "redis://dlock@127.0.0.1:6379/0",
                     "dlock_runner_backend_password": SECRET_RUNNER},
    "dlock_jobs": {},
}

# What each role's play renders after its preflight (templates of the role).
RENDERS = {
    "dlock_redis": ["dlock.conf.j2"],
    "dlock_postgresql": ["dlock.conf.j2", "pg_hba.conf.j2"],
    "dlock_etcd": ["etcd.env.j2"],
    "dlock_chrony": ["chrony.conf.j2"],
    "dlock_metrics": ["node-exporter.defaults.j2", "refresh.service.j2", "refresh.timer.j2"],
    "dlock_runner": [],
    "dlock_jobs": [],
}

NL = "\n"
CASES = []


def case(role, field, **variables):
    """A case: these variables (short names, the role's prefix added) must be
    refused with a message naming `field` (short name, prefix added)."""
    prefix = role + "_"
    CASES.append((role, prefix + field, dict((prefix + k, v) for k, v in variables.items())))


# -- dlock_redis ----------------------------------------------------------------
R = "dlock_redis"
case(R, "bind", bind="127.0.0.1" + NL + "loadmodule /x.so")
case(R, "bind", bind=["127.0.0.1" + NL + "loadmodule /x.so"])
case(R, "bind", bind=["127.0.0.1 0.0.0.0"])
case(R, "bind", bind=[])
case(R, "bind", bind=["*"])
case(R, "bind", bind=["-::1"])
case(R, "port", port=0)
case(R, "port", port=65536)
case(R, "port", port="80 x")
case(R, "port", port="6379" + NL + "enable-debug-command yes")
case(R, "port", port=6379.5)
case(R, "port", port=True)
case(R, "user", user="dlock" + NL + "user evil on nopass ~* +@all")
case(R, "user", user="dlock on >x")
case(R, "user", user="default")
case(R, "user", user="")
case(R, "user", user="-dlock")
case(R, "password", password=SECRET_REDIS[:12])
case(R, "password", password=SECRET_REDIS + " x")
case(R, "password", password=SECRET_REDIS + NL + "loadmodule /x.so")
case(R, "password", password=SECRET_REDIS + "\x00")
case(R, "password", password=[SECRET_REDIS])
case(R, "admin_user", admin_user="dlock")
case(R, "admin_user", admin_user="admin" + NL + "enable-debug-command yes")
case(R, "admin_password", admin_password=SECRET_ADMIN[:10])
case(R, "admin_password", admin_password=SECRET_ADMIN + "\u2028")
case(R, "appendfsync", appendfsync="always" + NL + "loadmodule /x.so")
case(R, "appendfsync", appendfsync="sometimes")
case(R, "maxmemory", maxmemory="1gb" + NL + "loadmodule /x.so")
case(R, "maxmemory", maxmemory="NaN")
case(R, "maxmemory", maxmemory="1e308")
case(R, "maxmemory", maxmemory=-1)
case(R, "maxmemory", maxmemory=float("nan"))
case(R, "maxmemory", maxmemory="999999999999999gb")
case(R, "bind", bind=5)
case(R, "port", port="{{ no_such_variable }}")
case(R, "tls", tls="yes")
case(R, "tls_cert_file", tls=True, tls_key_file="/etc/ssl/k.pem", tls_ca_file="/etc/ssl/ca.pem")
case(R, "tls_cert_file", tls=True, tls_cert_file="relative/cert.pem", tls_key_file="/k", tls_ca_file="/ca")
case(R, "tls_key_file", tls_key_file="/etc/../etc/shadow")
case(R, "tls_ca_file", tls_ca_file="/etc/ssl/ca.pem" + NL + "tls-auth-clients no")
case(R, "tls_ca_file", tls_ca_file="/etc/ssl/ca pem")
case(R, "tls_auth_clients", tls_auth_clients="no")
case(R, "url_host", url_host="host name")
case(R, "url_host", url_host="evil@host")
case(R, "url_host", url_host="")

# -- dlock_postgresql -----------------------------------------------------------
P = "dlock_postgresql"
case(P, "clients", clients="10.0.0.0/24")
case(P, "clients", clients=["10.0.0.0/8 trust"])
case(P, "clients", clients=["all all 0.0.0.0/0 trust"])
case(P, "clients", clients=["0.0.0.0/0" + NL + "host all all 0.0.0.0/0 trust"])
case(P, "clients", clients=["all"])
case(P, "clients", clients=["samenet"])
case(P, "clients", clients=["10.0.0.1/8"])
case(P, "clients", clients=["10.0.0.0/33"])
case(P, "clients", clients=[])
case(P, "clients", clients=[".example.com"])
case(P, "clients", clients=["@hosts.txt"])
case(P, "clients", clients=[10])
case(P, "clients", clients=["fe80::1%eth0"])
case(P, "listen_addresses", listen_addresses=["*' ssl = 'off"])
case(P, "listen_addresses", listen_addresses="localhost")
case(P, "listen_addresses", listen_addresses=["localhost" + NL + "ssl = off"])
case(P, "listen_addresses", listen_addresses=[])
case(P, "listen_addresses", listen_addresses=["a,b"])
case(P, "listen_addresses", listen_addresses=5)
case(P, "port", port=0)
case(P, "port", port="5432 x")
case(P, "port", port=65536)
case(P, "database", database="dlock" + NL + "host all all 0.0.0.0/0 trust")
case(P, "database", database="Dlock")
case(P, "database", database="all")
case(P, "database", database="replication")
case(P, "user", user="postgres")
case(P, "user", user="pg_monitor")
case(P, "user", user="all")
case(P, "user", user="dlock'; DROP ROLE x; --")
case(P, "password", password=SECRET_PG[:12])
case(P, "password", password=SECRET_PG + "\u00e9")
case(P, "password", password=SECRET_PG + NL)
case(P, "password", password=SECRET_PG + " x")
case(P, "connection_limit", connection_limit=0)
case(P, "connection_limit", connection_limit="NaN")
case(P, "connection_limit", connection_limit=1e308)
case(P, "tcp_keepalives_idle", tcp_keepalives_idle="5" + NL + "ssl = off")
case(P, "tcp_keepalives_idle", tcp_keepalives_idle=0)
case(P, "tcp_keepalives_interval", tcp_keepalives_interval=99999)
case(P, "tcp_keepalives_count", tcp_keepalives_count="NaN")
case(P, "tcp_user_timeout", tcp_user_timeout="10m")
case(P, "tcp_user_timeout", tcp_user_timeout="10s'; ssl = 'off")
case(P, "tcp_user_timeout", tcp_user_timeout="1e308")
case(P, "client_connection_check_interval", client_connection_check_interval="-1s")
case(P, "client_connection_check_interval", client_connection_check_interval=float("inf"))
case(P, "tls", tls="true")
case(P, "tls_cert_file", tls=True, tls_key_file="/etc/ssl/k.pem")
case(P, "tls_cert_file", tls_cert_file="server.crt")
case(P, "tls_key_file", tls_key_file="/etc/ssl/x.key' ssl = 'off")
case(P, "tls_ca_file", tls_ca_file="/etc/%h/ca.pem")
case(P, "url_scheme", url_scheme="mysql")
case(P, "url_host", url_host="db host")
case(P, "version", version="15" + NL)
case(P, "version", version="15; rm -rf /")
case(P, "version", version=9)
case(P, "cluster", cluster="../main")
case(P, "cluster", cluster="main x")
case(P, "ha", ha="yes")
case(P, "ha_name", ha_name="b1" + NL + "scope: other")
case(P, "ha_address", ha_address="10.0.0.1/24")
case(P, "ha_etcd_endpoints", ha_etcd_endpoints="http://10.0.0.1:2379")
case(P, "ha_etcd_endpoints", ha_etcd_endpoints=["http://10.0.0.1:2379/v3"])
case(P, "ha_etcd_endpoints", ha_etcd_endpoints=["10.0.0.1:2379"])
case(P, "ha_etcd_endpoints", ha=True, ha_etcd_endpoints=[])
case(P, "ha_etcd_prefix", ha_etcd_prefix="/patroni/")
case(P, "ha_etcd_password", ha_etcd_password=SECRET_PG + " x")
case(P, "ha_replication_user", ha=True, ha_replication_user="pg_replication")
case(P, "ha_replication_password", ha_replication_password=SECRET_PG[:12])
case(P, "ha_rewind_password", ha=True, ha_rewind_password="")
case(P, "ha_restapi_user", ha_restapi_user="patroni:x")
case(P, "ha_restapi_password", ha_restapi_password=SECRET_PG + NL)
case(P, "ha_ttl", ha=True, ha_ttl=14)
case(P, "ha_group", ha_group="dlock backend")
case(P, "ha_scope", ha_scope="dlock" + NL + "x")
case(P, "ha_data_dir", ha_data_dir="var/lib/postgresql/patroni")
case(P, "ha_etcd_user", ha_etcd_user="patroni x")
case(P, "ha_etcd_ca_file", ha_etcd_ca_file="ca.pem")
case(P, "ha_rewind_user", ha_rewind_user="Rewind")
case(P, "ha_restapi_port", ha_restapi_port=70000)
case(P, "ha_loop_wait", ha_loop_wait=0)
case(P, "ha_retry_timeout", ha_retry_timeout=2)
case(P, "tls", ha=True, tls=True, tls_cert_file="/etc/ssl/c.pem", tls_key_file="/etc/ssl/k.pem")
case(P, "url_scheme", ha=True, url_scheme="postgresql+advisory")

# -- dlock_chrony ---------------------------------------------------------------
C = "dlock_chrony"
case(C, "servers", servers="ntp1.example.com")
case(C, "servers", servers=["ntp1" + NL + "allow all"])
case(C, "servers", servers=["ntp1 iburst"])
case(C, "servers", servers=["-ntp1"])
case(C, "pools", pools=["pool.ntp.org" + NL + "cmdallow all"])
case(C, "pools", pools=[""])
case(C, "source_options", source_options="iburst" + NL + "allow all")
case(C, "source_options", source_options=["iburst"])
case(C, "source_options", source_options="iburst # x")
case(C, "source_options", source_options="iburst bogus")
case(C, "source_options", source_options="minpoll 99")
case(C, "makestep_threshold", makestep_threshold="NaN")
case(C, "makestep_threshold", makestep_threshold=1e308)
case(C, "makestep_threshold", makestep_threshold=0)
case(C, "makestep_threshold", makestep_threshold="1.0" + NL + "allow all")
case(C, "makestep_limit", makestep_limit=-1)
case(C, "makestep_limit", makestep_limit="3 x")
case(C, "slew_only", slew_only="yes")
case(C, "slew_only", slew_only="true" + NL + "makestep 1 -1")
case(C, "maxslewrate", slew_only=True, maxslewrate=83333)
case(C, "maxslewrate", slew_only=True, maxslewrate="NaN")
case(C, "maxslewrate", slew_only=True, maxslewrate=0)
case(C, "maxslewrate", slew_only=True, maxslewrate="500" + NL + "makestep 1 -1")
case(C, "extra_config", slew_only=True, extra_config=["makestep 1 -1"])
case(C, "extra_config", slew_only=True, extra_config=["maxslewrate 83333"])
case(C, "allow", allow="10.0.0.0/8")
case(C, "allow", allow=["all"])
case(C, "allow", allow=["10.0.0.0/8" + NL + "cmdallow all"])
case(C, "allow", allow=["10.0.0.1/8"])
case(C, "local_stratum", local_stratum=16)
case(C, "local_stratum", local_stratum=-1)
case(C, "local_orphan", local_orphan="yes")
case(C, "local_orphan", local_orphan=[True])
case(C, "local_orphan", local_orphan="true" + NL + "local stratum 1")
case(C, "local_orphan", local_orphan=True, local_stratum=0, servers=["ntp.example.org"])
case(C, "container_mode", container_mode="yes")
case(C, "wait_sync", wait_sync="false")
case(C, "wait_sync_tries", wait_sync_tries=0)
case(C, "wait_sync_tries", wait_sync_tries=1e308)
case(C, "wait_sync_interval", wait_sync_interval="NaN")
case(C, "wait_sync_interval", wait_sync_interval=0)
case(C, "wait_sync_max_correction", wait_sync_max_correction=float("inf"))
case(C, "wait_at_boot", wait_at_boot=1)
case(C, "extra_config", extra_config="hwtimestamp *")
case(C, "extra_config", extra_config=["hwtimestamp *" + NL + "cmdallow all"])
case(C, "extra_config", extra_config=["log\x00"])
case(C, "extra_config", extra_config=[5])
case(C, "servers", servers=[], pools=[], local_stratum=0)

# -- dlock_metrics --------------------------------------------------------------
M = "dlock_metrics"
case(M, "textfile_dir", textfile_dir="var/lib/node-exporter")
case(M, "textfile_dir", textfile_dir="/var/lib/../x")
case(M, "textfile_dir", textfile_dir="/var/lib/x y")
case(M, "textfile_dir", textfile_dir="/var/%h")
case(M, "listen_address", listen_address=":0")
case(M, "listen_address", listen_address=":65536")
case(M, "listen_address", listen_address="localhost")
case(M, "listen_address", listen_address=":9100" + NL + "ARGS=x")
case(M, "listen_address", listen_address="::1:9100")
case(M, "listen_address", listen_address="[::1]:9100 --web.config.file=/x")
case(M, "listen_address", listen_address="host name:9100")
case(M, "node_exporter_args", node_exporter_args="--collector.systemd")
case(M, "node_exporter_args", node_exporter_args=['--x=1" ; touch /tmp/pwned ; "'])
case(M, "node_exporter_args", node_exporter_args=["--web.listen-address=:1"])
case(M, "node_exporter_args", node_exporter_args=["--a" + NL + "--b"])
case(M, "node_exporter_args", node_exporter_args=["-x"])
case(M, "node_exporter_args", node_exporter_args=["--x=$(id)"])
case(M, "node_exporter_hardening", node_exporter_hardening="yes")
case(M, "refresh", refresh="no")
case(M, "refresh_interval", refresh_interval="NaN")
case(M, "refresh_interval", refresh_interval="30x")
case(M, "refresh_interval", refresh_interval="0")
case(M, "refresh_interval", refresh_interval=1e308)
case(M, "refresh_interval", refresh_interval="30s" + NL + "ExecStartPre=/bin/sh -c id")
case(M, "refresh_user", refresh_user="root")
case(M, "refresh_user", refresh_user="dlock metrics")
case(M, "refresh_user", refresh_user="1000")
case(M, "refresh_user", refresh_user="%u")
case(M, "runner_bin", runner_bin="dlock")
case(M, "runner_bin", runner_bin="/usr/local/bin/dlock %n")
case(M, "group", group="dlock" + NL + "User=root")
case(M, "jobs_dir", jobs_dir="../jobs")
case(M, "password_path", password_path="/etc/dlock/pw%")
case(M, "unit_dir", unit_dir="")
case(M, "rules_path", rules_path="rules.yml")

# -- dlock_runner ---------------------------------------------------------------
N = "dlock_runner"
case(N, "backend_url", backend_url="")
case(N, "backend_url", backend_url="redis://dlock:%s@127.0.0.1:6379/0" % SECRET_URL)
case(N, "backend_url", backend_url="redis://127.0.0.1:6379/0?password=%s" % SECRET_URL)
case(N, "backend_url", backend_url="redis://dlock:%s@[::1:6379/0" % SECRET_URL)
# A password holding the URL's own separators (unencoded): '/' would put it in the path, '?' and '#' in the
# query or the fragment, an '@' before the host's; each once echoed the password in the refusal.
case(N, "backend_url", backend_url="redis://dlock:%s/0@127.0.0.1:6379/0" % SECRET_URL)
case(N, "backend_url", backend_url="postgresql://dlock:%s?#@a@127.0.0.1/dlock" % SECRET_URL)
case(N, "backend_url", backend_url="postgresql://dlock@db:5432/dlock?sslmode=require&sslpassword=%s" % SECRET_URL)
case(N, "backend_url", backend_url="redis://127.0.0.1:0/0")
case(N, "backend_url", backend_url="redis://127.0.0.1:80 x/0")
case(N, "backend_url", backend_url="mysql://db/x")
case(N, "backend_url", backend_url="redis://127.0.0.1/0" + NL + "ExecStartPre=/bin/sh")
case(N, "backend_url", backend_url=["redis://127.0.0.1/0"])
case(N, "backend_password", backend_password=SECRET_RUNNER + NL + "x")
case(N, "backend_password", backend_password=[SECRET_RUNNER])
case(N, "backend_password", backend_password=SECRET_RUNNER + "\x00")
case(N, "ca_file", ca_file="ca.pem")
case(N, "config_dir", config_dir="/etc/dlock/")
case(N, "jobs_dir", jobs_dir="/etc/dlock/../jobs")
case(N, "password_path", password_path="backend.password")
case(N, "install_dir", install_dir="/usr/local/lib/dlock" + NL)
case(N, "bin", bin="/usr/local/bin/dl ock")
case(N, "python", python="python3")
case(N, "group", group="dlock" + NL + "root")
case(N, "group", group="1000")
case(N, "group", group="root")
case(N, "metrics_dir", metrics_dir="x")
case(N, "pauses_dir", pauses_dir="/var/lib/dlock/pauses" + NL)
case(N, "pauses_dir", pauses_dir=["/var/lib/dlock/pauses"])
case(N, "defaults", defaults="ttl=30s")
case(N, "defaults", defaults={"ttl": "NaN"})
case(N, "defaults", defaults={"ttl": 1e308})
case(N, "defaults", defaults={"colour": "blue"})
case(N, "install_driver", install_driver="yes")
case(N, "fence_epoch", fence_epoch="one")
case(N, "fence_epoch", fence_epoch=True)
case(N, "fence_epoch", fence_epoch="NaN")
case(N, "fence_epoch", fence_epoch=float("nan"))
case(N, "fence_epoch", fence_epoch=1e308)
case(N, "fence_epoch", fence_epoch=-1)
case(N, "fence_epoch", fence_epoch=2 ** 13)
case(N, "fence_epoch", fence_epoch="1" + NL)
case(N, "fence_epoch", fence_epoch="1\x00")
case(N, "fence_epoch", fence_epoch=1.5)

# -- dlock_jobs (its own settings; the job list has its own suite) ---------------
J = "dlock_jobs"
case(J, "randomized_delay", randomized_delay="NaN")
case(J, "randomized_delay", randomized_delay="1e308")
case(J, "randomized_delay", randomized_delay="-5s")
case(J, "randomized_delay", randomized_delay="5 minutes")
case(J, "randomized_delay", randomized_delay="5s" + NL + "ExecStartPre=/bin/sh")
case(J, "accuracy", accuracy="inf")
case(J, "accuracy", accuracy=float("inf"))
case(J, "persistent", persistent="true")
case(J, "persistent", persistent=1)
case(J, "user", user="root" + NL + "ExecStartPre=/bin/sh")
case(J, "user", user="ro ot")
case(J, "user", user="%u")
case(J, "hardening", hardening="no")
case(J, "runner_bin", runner_bin="dlock")
case(J, "jobs_dir", jobs_dir="/etc/dlock/jobs/")
case(J, "group", group="dlock" + NL + "User=root")
case(J, "password_path", password_path="%d/x")
case(J, "metrics_dir", metrics_dir="relative")
case(J, "unit_dir", unit_dir="/etc/systemd/system/../x")
case(J, "backend_url", backend_url="bogus://db1")
case(J, "backend_url", backend_url="redis://u:%s@db1:6379/0" % SECRET_URL)
case(J, "backend_url", backend_url="redis://db1:6379/0" + NL + "ExecStartPre=/bin/sh")
case(J, "drain_timeout", drain_timeout="NaN")
case(J, "drain_timeout", drain_timeout=1e308)
case(J, "drain_timeout", drain_timeout="0s")
case(J, "drain_timeout", drain_timeout="1h" + NL + "x")
case(J, "drain_timeout", drain_timeout="1h\x00")
case(J, "drain_timeout", drain_timeout=["1h"])

# -- dlock_etcd -----------------------------------------------------------------
E = "dlock_etcd"
case(E, "group", group="dlock backend")
case(E, "group", group=["dlock_backend"])
case(E, "name", name="e1,e2=http://10.6.6.6:2380")
case(E, "name", name="")
case(E, "address", address="etcd1.example.com")
case(E, "address", address="10.0.0.1" + NL + "ETCD_UNSAFE_NO_FSYNC=true")
case(E, "address", address="fe80::1%eth0")
case(E, "client_port", client_port=0)
case(E, "client_port", client_port="2379" + NL + "ETCD_ENABLE_V2=true")
case(E, "peer_port", peer_port=65536)
case(E, "peer_port", client_port=2380)
case(E, "metrics_port", metrics_port=65536)
case(E, "metrics_port", metrics_port=-1)
case(E, "metrics_port", metrics_port="2381" + NL + "ETCD_UNSAFE_NO_FSYNC=true")
case(E, "metrics_port", metrics_port="NaN")
case(E, "metrics_port", metrics_port=1e308)
case(E, "metrics_port", metrics_port=[2381])
case(E, "metrics_port", metrics_port=2379)
case(E, "metrics_port", metrics_port=2380)
case(E, "data_dir", data_dir="var/lib/etcd")
case(E, "data_dir", data_dir="/var/lib/etcd/../../tmp")
case(E, "initial_cluster_state", initial_cluster_state="maybe")
case(E, "initial_cluster_token", initial_cluster_token="tok en")
case(E, "initial_cluster_token", initial_cluster_token="-x")
case(E, "heartbeat_interval", heartbeat_interval=5)
case(E, "heartbeat_interval", heartbeat_interval="100ms")
case(E, "election_timeout", election_timeout=100000)
case(E, "election_timeout", election_timeout=400)
case(E, "quota_backend_bytes", quota_backend_bytes=1024)
case(E, "quota_backend_bytes", quota_backend_bytes=16 * 1024 ** 3)
case(E, "auto_compaction_retention", auto_compaction_retention=10)
case(E, "auto_compaction_retention", auto_compaction_retention="1h")
case(E, "root_password", root_password="")
case(E, "root_password", root_password=SECRET_ETCD_ROOT[:10])
case(E, "root_password", root_password=SECRET_ETCD_ROOT + " x")
case(E, "user", user="root")
case(E, "user", user="dlock:x")
case(E, "user", user="")
case(E, "password", password="")
case(E, "password", password=SECRET_ETCD + NL)
case(E, "password", password=SECRET_ETCD_ROOT)
case(E, "prefix", prefix="/dlock/")
case(E, "prefix", prefix="dlock")
case(E, "prefix", prefix="/")
case(E, "prefix", prefix="/dlock/../other")
case(E, "tls", tls="yes")
case(E, "tls_cert_file", tls=True, tls_key_file="/k.pem", tls_ca_file="/ca.pem")
case(E, "tls_key_file", tls_key_file="relative.pem")
case(E, "extra_users", extra_users=[{"name": "root", "password": SECRET_ETCD + "x", "prefix": "/patroni"}])
case(E, "extra_users", extra_users=[{"name": "patroni", "password": SECRET_ETCD + "x", "prefix": "/dlock/patroni"}])
case(E, "extra_users", extra_users=[{"name": "patroni", "password": SECRET_ETCD_ROOT, "prefix": "/patroni"}])
case(E, "extra_users", extra_users=[{"name": "dlock", "password": SECRET_ETCD + "x", "prefix": "/other"}])
case(E, "extra_users", extra_users=["patroni:" + SECRET_ETCD])
case(E, "extra_users", extra_users=[{"name": "patroni", "password": SECRET_ETCD + "x"}])
case(E, "tls_ca_file", tls=True, tls_cert_file="/c.pem", tls_key_file="/k.pem")
case(E, "peer_tls", peer_tls=1)
case(E, "peer_tls_cert_file", peer_tls_cert_file="/etc/etcd/p.pem" + NL + "ETCD_PEER_CLIENT_CERT_AUTH=false")
case(E, "peer_tls_key_file", peer_tls=True, peer_tls_cert_file="/p.pem", peer_tls_ca_file="/ca.pem")
case(E, "peer_tls_ca_file", peer_tls_ca_file="/etc/etcd/ca pem")

# One good host per role, in the runs of the bad ones where nothing stops them.
GOOD = {
    "dlock_redis": {"dlock_redis_maxmemory": "256mb", "dlock_redis_port": "6380"},
    "dlock_postgresql": {"dlock_postgresql_clients": ["10.0.0.5", "fd00::/64", "node1.example.com"]},
    "dlock_etcd": {"dlock_etcd_prefix": "/locks/prod", "dlock_etcd_client_port": 12379},
    "dlock_chrony": {"dlock_chrony_servers": ["ntp1.example.com"], "dlock_chrony_allow": ["10.0.0.0/8"],
                     "dlock_chrony_extra_config": ["hwtimestamp *"]},
    "dlock_metrics": {"dlock_metrics_node_exporter_args": ["--collector.systemd"]},
    "dlock_runner": {},
    "dlock_jobs": {},
}

RUNS = {
    "backends": ["dlock_redis", "dlock_postgresql", "dlock_etcd", "dlock_chrony", "dlock_metrics"],
    "runner": ["dlock_runner"],
    "jobs": ["dlock_jobs"],
}

PLAY = """
- name: {role}
  hosts: {role}
  gather_facts: false
  tasks:
    - name: Preflight of {role}
      ansible.builtin.import_role:
        name: dlock.fleet.{role}
        tasks_from: preflight.yml
    - name: Render the role's templates
      ansible.builtin.set_fact:
        __rendered: >-
          {{{{ __rendered | default({{}}) | combine({{item: lookup('ansible.builtin.template',
               '{root}/roles/{role}/templates/' ~ item)}}) }}}}
      loop: {renders}
    - name: Write what the role would write
      ansible.builtin.copy:
        content: "{{{{ __rendered | default({{}}) | to_json }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.json"
        mode: "0600"
"""


def host_name(role, index):
    return "%s-%03d" % (role.replace("_", "-"), index)


@pytest.fixture(scope="module")
def fact_cache(tmp_path_factory):
    """A jsonfile fact cache holding the facts of a real `setup` (min subset)
    of localhost, under every case's host name."""
    cache = tmp_path_factory.mktemp("facts")
    env = ansible_env({"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache)})
    play = cache / "gather.yml"
    play.write_text("- hosts: localhost\n  gather_facts: true\n  gather_subset: [min]\n  tasks: []\n")
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-c", "local", "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(play)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The file's name is the host's, with a prefix that depends on the version.
    [facts] = [name for name in os.listdir(str(cache)) if name.endswith("localhost")]
    return cache, facts[:-len("localhost")]


def run_cases(tmp_path, fact_cache, roles, hosts_by_role):
    """One ansible-playbook -vvv run over these hosts; (proc, output, {host: failure result})."""
    cache, prefix = fact_cache
    out = tmp_path / "out"
    out.mkdir()
    inventory = {"all": {"children": {}}}
    for role in roles:
        hosts = {}
        for name, variables in hosts_by_role[role]:
            hosts[name] = dict(BASE[role], ansible_connection="local", ansible_python_interpreter=sys.executable,
                               **variables)
            shutil.copy(str(cache / (prefix + "localhost")), str(cache / (prefix + name)))
        inventory["all"]["children"][role] = {"hosts": hosts}
        if role == "dlock_etcd":  # every etcd host a one-member cluster (BASE names the group)
            for name in hosts:
                inventory["all"]["children"]["etcd_" + name.replace("-", "_")] = {"hosts": {name: {}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playbook = "".join(PLAY.format(role=role, root=ROOT, out=out, renders=json.dumps(RENDERS[role]))
                       for role in roles)
    (tmp_path / "play.yml").write_text(playbook)
    env = ansible_env({"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache),
                       "ANSIBLE_FORKS": "10", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"})
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"), "-vvv",
                           str(tmp_path / "play.yml")],
                          env=env, capture_output=True, text=True, timeout=480, check=False)
    output = proc.stdout + proc.stderr
    failures = {}
    for match in re.finditer(r"^fatal: \[([^\]]+)\]: FAILED! => (\{.*?^\})", proc.stdout, re.M | re.S):
        failures.setdefault(match.group(1), []).append(json.loads(match.group(2)))
    return proc, output, failures, out


def check_secrets(output):
    """No test password, nor any piece of one (every one holds MARK), shows."""
    assert MARK not in output, "a password shows in the output: %s" % output[output.index(MARK) - 200:][:400]


@pytest.mark.parametrize("run", sorted(RUNS))
def test_hostile_role_variables_are_refused_and_named(tmp_path, fact_cache, run):
    roles = RUNS[run]
    cases = [c for c in CASES if c[0] in roles]
    hosts_by_role = dict((role, []) for role in roles)
    expected = {}
    for index, (role, field, variables) in enumerate(cases):
        name = host_name(role, index)
        hosts_by_role[role].append((name, variables))
        expected[name] = (role, field, variables)
    if len(roles) > 1:
        # ansible-playbook ends the whole run after a play in which every host
        # failed: a good host in each play keeps it going (and must get through).
        for role in roles:
            hosts_by_role[role].append((host_name(role, 999), GOOD[role]))
    proc, output, failures, out = run_cases(tmp_path, fact_cache, roles, hosts_by_role)
    assert proc.returncode == 2, output[-3000:]
    if len(roles) > 1:
        check_good_hosts(roles, failures, out)
    assert "Traceback" not in output
    check_secrets(output)
    wrong = []
    for name, (role, field, variables) in sorted(expected.items()):
        results = failures.get(name)
        written = sorted(p.name for p in out.iterdir() if p.name.startswith(name + "."))
        problem = None
        if not results:
            problem = "not refused"
        elif written:
            problem = "wrote %s" % written
        else:
            result = results[-1]
            message = result.get("msg", "")
            if "exception" in result:
                problem = "exception: %s" % result["exception"][:200]
            elif not message.startswith(role + ": ") or result.get("assertion") is None:
                problem = "refused elsewhere than the role's check: %s" % message[:300]
            elif not re.search(r"\b%s\b" % re.escape(field), message):
                problem = "message does not name %s: %s" % (field, message[:300])
        if problem:
            wrong.append("%s %s %s: %s" % (name, field, json.dumps(variables)[:120], problem))
    assert wrong == [], "\n".join(wrong)


def check_good_hosts(roles, failures, out):
    """The good host of each role got through and rendered what was intended."""
    rendered = {}
    for role in roles:
        name = host_name(role, 999)
        assert name not in failures, failures[name]
        rendered[role] = json.loads((out / (name + ".json")).read_text())
        assert sorted(rendered[role]) == sorted(RENDERS[role])
    if "dlock_postgresql" in roles:
        hba = rendered["dlock_postgresql"]["pg_hba.conf.j2"]
        rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
        assert rules == [["local", "all", "postgres", "peer"],
                         ["host", "dlock", "dlock", "10.0.0.5/32", "scram-sha-256"],
                         ["host", "dlock", "dlock", "fd00::/64", "scram-sha-256"],
                         ["host", "dlock", "dlock", "node1.example.com", "scram-sha-256"]]
    if "dlock_redis" in roles:
        redis = rendered["dlock_redis"]["dlock.conf.j2"]
        assert "\nport 6380\n" in redis and "\nmaxmemory 256mb\n" in redis and "\nbind 127.0.0.1\n" in redis
    if "dlock_etcd" in roles:
        etcd = rendered["dlock_etcd"]["etcd.env.j2"]
        assert "\nETCD_LISTEN_CLIENT_URLS=http://127.0.0.1:12379\n" in etcd, etcd
        assert "\nETCD_INITIAL_CLUSTER=dlock-etcd-999=http://127.0.0.1:2380\n" in etcd, etcd
    if "dlock_chrony" in roles:
        chrony = rendered["dlock_chrony"]["chrony.conf.j2"]
        assert "\nserver ntp1.example.com iburst\n" in chrony and "\nallow 10.0.0.0/8\n" in chrony
        assert "\nhwtimestamp *\n" in chrony


def test_good_settings_get_through(tmp_path, fact_cache):
    """The runner's and the jobs role's plays with good settings (the other
    roles have a good host in their hostile run): they get to the end, so
    'nothing written' above means something."""
    roles = RUNS["runner"] + RUNS["jobs"]
    hosts_by_role = dict((role, [(host_name(role, 999), GOOD[role])]) for role in roles)
    proc, output, failures, out = run_cases(tmp_path, fact_cache, roles, hosts_by_role)
    assert proc.returncode == 0, output[-5000:]
    assert failures == {}
    check_secrets(output)
    check_good_hosts(roles, failures, out)


def test_case_count():
    """At least 150 hostile cases, and every variable of every role has one."""
    from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.check import TABLES
    assert len(CASES) >= 150
    covered = set(field for _role, field, _variables in CASES)
    missing = sorted(name for table in TABLES.values() for name in table if name not in covered)
    assert missing == []
