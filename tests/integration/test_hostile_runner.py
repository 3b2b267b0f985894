"""Hostile input to the node runner: flags, dlock.json, job files, password
and config files that are not what they claim to be.

Every case runs the real runner (`python -m dlock run`) against a real Redis
where another owner holds the job's lock, and asserts what an operator and an
attacker with write access to one value care about:
- exit 78 (configuration error), never 75: fail_open can never run a job
  without a lock because of a typo (every case sets fail_open: true);
- the message names the field (and the file), and shows no traceback;
- no secret appears in anything the runner printed;
- nothing was written: the job did not start, no metrics or state file;
- the other owner's lock is still held, by the same owner, with the same fence;
- no hang: every case runs under a timeout, a FIFO included.
"""

import json
import os
import stat
import subprocess

import pytest
from runner_proc import run_dlock

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

SECRET = "Hostile-Secret-0123456789"
OTHER = "other-node:1:feedfacefeedfacefeedface"
JOB = "hostile"
GOOD_JOB = {"command": ["@MARKER@"], "ttl": "30s", "fail_open": True}

# (id, where the bad value goes, the value, expected fragment of the message)
#   where: "flag:--name" (the value as that flag), "config:FIELD" (dlock.json
#   field, JSON value), "defaults:FIELD", "job:FIELD" (job file field),
#   "config-text" / "job-text" (the whole file, raw text), "password" (the
#   password file's content, bytes), "password-kind"/"config-kind" (a file
#   that is not a regular file).
CASES = [
    # -- durations: flags -------------------------------------------------------
    ("ttl NaN", "flag:--ttl", "NaN", "ttl: 'NaN' is not a duration"),
    ("ttl nan", "flag:--ttl", "nan", "ttl: 'nan' is not a duration"),
    ("ttl inf", "flag:--ttl", "inf", "ttl: 'inf' is not a duration"),
    ("ttl 1e308", "flag:--ttl", "1e308", "ttl: '1e308' is not a duration"),
    ("ttl huge digits", "flag:--ttl", "9" * 30, "is not a duration"),
    ("ttl 31d", "flag:--ttl", "31d", "ttl: '31d' is above the maximum of 30d"),
    ("ttl negative", "flag:--ttl", "-5s", "ttl: '-5s' is not a duration"),
    ("ttl zero", "flag:--ttl", "0", "ttl: '0' must be greater than 0"),
    ("ttl below 1s", "flag:--ttl", "500ms", "ttl: '500ms' is below the minimum of 1s"),
    ("ttl arabic digits", "flag:--ttl", "\u0661\u0660", "is not a duration"),
    ("ttl fullwidth digits", "flag:--ttl", "\uff11\uff10s", "is not a duration"),
    ("ttl trailing newline", "flag:--ttl", "10s\n", "is not a duration"),
    ("ttl tab", "flag:--ttl", "10\ts", "is not a duration"),
    ("ttl unit typo", "flag:--ttl", "5x", "ttl: '5x' is not a duration"),
    ("ttl hex", "flag:--ttl", "0x10", "is not a duration"),
    ("ttl exponent", "flag:--ttl", "1e2", "is not a duration"),
    ("renew_every zero", "flag:--renew-every", "0", "renew_every: '0' must be greater than 0"),
    ("renew_every NaN", "flag:--renew-every", "NaN", "renew_every: 'NaN' is not a duration"),
    ("renew_every above ttl", "flag:--renew-every", "40s", "must be below ttl (30s)"),
    ("kill_grace NaN", "flag:--kill-grace", "NaN", "kill_grace: 'NaN' is not a duration"),
    ("kill_grace 1e308", "flag:--kill-grace", "1e308", "kill_grace: '1e308' is not a duration"),
    ("kill_grace too long", "flag:--kill-grace", "29s", "must be below ttl (30s)"),
    ("op_timeout zero", "flag:--op-timeout", "0", "op_timeout: '0' must be greater than 0"),
    ("op_timeout inf", "flag:--op-timeout", "inf", "op_timeout: 'inf' is not a duration"),
    ("wait_timeout NaN", "flag:--wait-timeout", "NaN", "wait_timeout: 'NaN' is not a duration"),
    ("wait_timeout 1e308", "flag:--wait-timeout", "1e308", "is not a duration"),
    ("min_hold 31d", "flag:--min-hold", "31d", "min_hold: '31d' is above the maximum of 30d"),
    ("once_per below 1s", "flag:--once-per", "500ms", "once_per: '500ms' is below the minimum of 1s"),
    ("once_per NaN", "flag:--once-per", "NaN", "once_per: 'NaN' is not a duration"),
    ("once_per not whole seconds", "flag:--once-per", "1500ms", "once_per: '1500ms' is not a whole number of seconds"),
    ("max_runtime zero", "flag:--max-runtime", "0", "max_runtime: '0' must be greater than 0"),
    ("max_runtime inf", "flag:--max-runtime", "inf", "max_runtime: 'inf' is not a duration"),
    ("max_clock_skew NaN", "flag:--max-clock-skew", "NaN", "max_clock_skew: 'NaN' is not a duration"),
    ("on_contention other", "flag:--on-contention", "queue", "invalid choice"),
    ("history negative", "flag:--history", "-1", "history: '-1' must be a whole number"),
    ("history above 1000", "flag:--history", "1001", "history: 1001 is out of range (0-1000)"),
    ("history NaN", "flag:--history", "NaN", "history: 'NaN' must be a whole number"),
    ("history 1e308", "flag:--history", "1e308", "history: '1e308' must be a whole number"),
    ("history newline", "flag:--history", "5\n", "must be a whole number"),
    ("history float", "job:history", 2.5, "history: 2.5 must be a whole number"),
    ("every_slot string", "job:every_slot", "yes", "every_slot: 'yes' must be true or false"),
    ("catch_up string", "job:catch_up", "all", "catch_up: 'all' must be a mapping"),
    ("catch_up list", "job:catch_up", ["all"], "catch_up: ['all'] must be a mapping"),
    ("catch_up policy", "job:catch_up", {"policy": "some"}, "catch_up.policy: 'some' must be one of"),
    ("catch_up unknown key", "job:catch_up", {"policy": "all", "every": 1}, "catch_up: unknown key 'every'"),
    ("catch_up window NaN", "job:catch_up", {"policy": "all", "window": "NaN"}, "catch_up.window: 'NaN' is not a duration"),
    ("catch_up window 1e308", "job:catch_up", {"policy": "all", "window": 1e308}, "catch_up.window:"),
    ("catch_up window 8d", "job:catch_up", {"policy": "all", "window": "8d"}, "is above the maximum of 7d"),
    ("catch_up window newline", "job:catch_up", {"policy": "all", "window": "1d\n"}, "is not a duration"),
    ("catch_up max 0", "job:catch_up", {"policy": "all", "max": 0}, "catch_up.max: 0 is out of range (1-100)"),
    ("catch_up max NaN", "job:catch_up", {"policy": "all", "max": "NaN"}, "catch_up.max: 'NaN' must be a whole number"),
    ("catch_up latest max 3", "job:catch_up", {"policy": "latest", "max": 3}, "catch_up.max: latest runs one slot"),
    ("catch_up without once_per", "job:catch_up", {"policy": "all"}, "catch_up: policy all needs once_per"),
    ("every_slot list", "job:every_slot", [True], "every_slot: [True] must be true or false"),
    ("history list", "job:history", [50], "history: [50] must be a whole number"),
    ("history bool", "defaults:history", True, "history: True must be a whole number"),
    ("history 1e308 number", "defaults:history", 1e308, "must be a whole number"),
    # -- names and keys: flags -------------------------------------------------
    ("key newline", "flag:--key", "a\nb", "--key: 'a\\nb' holds a control character"),
    ("key space", "flag:--key", "a b", "--key: 'a b' is not a valid lock key"),
    ("key too long", "flag:--key", "k" * 201, "is longer than 200 characters"),
    ("key escape", "flag:--key", "a\x1b[31m", "holds a control character"),
    ("key line separator", "flag:--key", "a\u2028b", "holds a control character"),
    ("key trailing newline", "flag:--key", "nightly\n", "holds a control character"),
    ("job newline", "flag:--job", "a\nb", "job: 'a\\nb' holds a control character"),
    ("job traversal", "flag:--job", "../../etc/passwd", "not a valid job name"),
    ("job too long", "flag:--job", "j" * 65, "is longer than 64 characters"),
    # -- URLs: flags -------------------------------------------------------------
    ("url password", "flag:--backend", "redis://u:%s@127.0.0.1:6379/0" % SECRET, "contains a password"),
    ("url password bad port", "flag:--backend", "redis://u:%s@127.0.0.1:99999/0" % SECRET, "contains a password"),
    ("url password with a slash", "flag:--backend", "redis://u:%s/0@127.0.0.1:6379/0" % SECRET, "contains a password"),
    ("url password with ? # @", "flag:--backend", "postgresql://u:%s?#@x@127.0.0.1/db" % SECRET,
     "contains a password"),
    ("url password query", "flag:--backend", "redis://127.0.0.1:6379/0?password=%s" % SECRET,
     "contains a password"),
    ("url pg password query", "flag:--backend", "postgresql://u@127.0.0.1/db?password=%s" % SECRET,
     "contains a password"),
    ("url pg sslpassword", "flag:--backend", "postgresql://u@127.0.0.1/db?sslpassword=%s" % SECRET,
     "contains a password"),
    ("url password uppercase query", "flag:--backend", "redis://127.0.0.1/0?PASSWORD=%s" % SECRET,
     "contains a password"),
    ("url port 0", "flag:--backend", "redis://127.0.0.1:0/0", "out of range (1-65535)"),
    ("url port 65536", "flag:--backend", "redis://127.0.0.1:65536/0", "out of range (1-65535)"),
    ("url port text", "flag:--backend", "redis://127.0.0.1:port/0", "the port must be a number"),
    ("url port negative", "flag:--backend", "redis://127.0.0.1:-1/0", "the port must be a number"),
    ("url no host", "flag:--backend", "redis:///0", "has no host"),
    ("url host space", "flag:--backend", "redis://my host:6379/0", "holds a control character or space"),
    ("url host newline", "flag:--backend", "redis://h\n:6379/0", "holds a control character or space"),
    ("url bad ipv6", "flag:--backend", "redis://[::1:6379/0", "bad IPv6 form"),
    ("url not ipv6", "flag:--backend", "redis://[zz::1]:6379/0", "is not an IPv6 address"),
    ("url redis db text", "flag:--backend", "redis://127.0.0.1:6379/abc", "the database must be a number"),
    ("url redis db huge", "flag:--backend", "redis://127.0.0.1:6379/99999", "out of range"),
    ("url redis query", "flag:--backend", "redis://127.0.0.1:6379/0?socket_timeout=0", "take no query parameters"),
    ("url redis two hosts", "flag:--backend", "redis://a:1,b:2/0", "only postgresql:// and etcd:// take a list"),
    ("url pg host param", "flag:--backend", "postgresql://u@127.0.0.1/db?host=10.9.9.9", "'host' is not allowed"),
    ("url pg options", "flag:--backend", "postgresql://u@127.0.0.1/db?options=-c%20x", "'options' is not allowed"),
    ("url pg not read-write", "flag:--backend", "postgresql://u@a,b/db?target_session_attrs=any",
     "dlock only uses a read-write server"),
    ("url pg no database", "flag:--backend", "postgresql://u@127.0.0.1", "name the database"),
    ("url etcd password", "flag:--backend", "etcd://u:%s@127.0.0.1:2379/dlock" % SECRET, "contains a password"),
    ("url etcd password query", "flag:--backend", "etcd+https://u@127.0.0.1:2379/dlock?password=%s" % SECRET,
     "contains a password"),
    ("url etcd prefix slash", "flag:--backend", "etcd://127.0.0.1:2379/dlock/", "the key prefix must be a path"),
    ("url etcd prefix dots", "flag:--backend", "etcd://127.0.0.1:2379/dlock/../x", "the key prefix must be a path"),
    ("url etcd empty member", "flag:--backend", "etcd://127.0.0.1:2379,,h2:2379/dlock", "has no host"),
    ("url etcd member port", "flag:--backend", "etcd://h1:2379,h2:0/dlock", "out of range (1-65535)"),
    ("url etcd cert over http", "flag:--backend", "etcd://h1:2379/dlock?cert=/etc/c.pem&key=/etc/k.pem",
     "take no query parameters"),
    ("url etcd cert without key", "flag:--backend", "etcd+https://h1:2379/dlock?cert=/etc/c.pem", "needs both"),
    ("url etcd cert relative", "flag:--backend", "etcd+https://h1:2379/dlock?cert=c.pem&key=/etc/k.pem",
     "must be an absolute path"),
    ("url etcd param", "flag:--backend", "etcd+https://h1:2379/dlock?timeout=0", "'timeout' is not allowed"),
    ("url etcd zone", "flag:--backend", "etcd://[fe80::1%25eth0]:2379/dlock", "IPv6 zone"),
    ("url scheme", "flag:--backend", "mysql://127.0.0.1/db", "unsupported scheme 'mysql'"),
    ("url not a url", "flag:--backend", "127.0.0.1:6379", "is not a URL"),
    ("url file relative", "flag:--backend", "file://run/dlock", "must be file:///absolute/directory"),
    ("url file traversal", "flag:--backend", "file:///run/../etc", "is not normalised"),
    ("url host label", "flag:--backend", "redis://-bad-.example:6379/0", "is not a host name"),
    ("url user odd", "flag:--backend", "redis://a'b@127.0.0.1:6379/0", "is not a valid value"),
    # -- paths: flags --------------------------------------------------------------
    ("metrics dir relative", "flag:--metrics-dir", "metrics", "--metrics-dir: 'metrics' must be an absolute path"),
    ("jobs dir traversal", "flag:--jobs-dir", "/etc/dlock/../../tmp", "is not normalised"),
    ("ca file newline", "flag:--ca-file", "/etc/ca\n.pem", "holds a control character"),
    ("password file relative", "flag:--password-file", "pw.txt", "must be an absolute path"),
    # -- dlock.json ----------------------------------------------------------------
    ("config NaN", "config-text", '{"backend": "@URL@", "defaults": {"ttl": NaN}}', "NaN is not a number JSON allows"),
    ("config Infinity", "config-text", '{"backend": "@URL@", "defaults": {"ttl": Infinity}}',
     "Infinity is not a number JSON allows"),
    ("config -Infinity", "config-text", '{"backend": "@URL@", "defaults": {"kill_grace": -Infinity}}',
     "-Infinity is not a number JSON allows"),
    ("config 1e308", "defaults:ttl", 1e308, "is above the maximum of 30d"),
    ("config 1e400", "config-text", '{"backend": "@URL@", "defaults": {"ttl": 1e400}}', "is not a finite duration"),
    ("config duplicate backend", "config-text", '{"backend": "redis://127.0.0.1:1/0", "backend": "@URL@"}',
     "the key 'backend' appears twice"),
    ("config backend list", "config:backend", ["@URL@"], "a backend URL is required"),
    ("config backend number", "config:backend", 6379, "a backend URL is required"),
    ("config metrics relative", "config:metrics_dir", "metrics", "metrics_dir: 'metrics' must be an absolute path"),
    ("config metrics newline", "config:metrics_dir", "/tmp/m\nExecStart=/bin/sh", "holds a control character"),
    ("config jobs_dir list", "config:jobs_dir", ["/etc"], "must be a string"),
    ("config pauses_dir list", "config:pauses_dir", ["/var/lib"], "pauses_dir: ['/var/lib'] must be a string"),
    ("config pauses_dir relative", "config:pauses_dir", "pauses", "pauses_dir: 'pauses' must be an absolute path"),
    ("config pauses_dir NUL", "config:pauses_dir", "/var/lib/p\x00", "holds a control character"),
    ("config password_file dots", "config:password_file", "/etc/dlock/../shadow", "is not normalised"),
    ("config defaults list", "config:defaults", ["ttl"], "defaults: ['ttl'] must be a mapping"),
    ("config unknown field", "config:metrics", "/tmp", "unknown field 'metrics'"),
    # -- fence_epoch (dlock.json): a whole number from 0 to 2**13 - 1 ----------------
    ("fence_epoch string", "config:fence_epoch", "one", "fence_epoch: 'one' must be a whole number"),
    ("fence_epoch true", "config:fence_epoch", True, "fence_epoch: True must be a whole number"),
    ("fence_epoch NaN", "config-text", '{"backend": "@URL@", "fence_epoch": NaN}', "NaN is not a number JSON allows"),
    ("fence_epoch 1e308", "config:fence_epoch", 1e308, "fence_epoch: 1e+308 must be a whole number"),
    ("fence_epoch negative", "config:fence_epoch", -1, "fence_epoch: -1 is out of range (0-8191)"),
    ("fence_epoch 2**13", "config:fence_epoch", 2 ** 13, "fence_epoch: 8192 is out of range (0-8191)"),
    ("fence_epoch newline", "config:fence_epoch", "1\n", "fence_epoch: '1\\n' must be a whole number"),
    ("fence_epoch NUL", "config:fence_epoch", "1\x00", "fence_epoch: '1\\x00' must be a whole number"),
    ("fence_epoch 1.5", "config:fence_epoch", 1.5, "fence_epoch: 1.5 must be a whole number"),
    ("config array", "config-text", "[1, 2]", "must hold a JSON object"),
    # Python's parser recurses: this once ended in a RecursionError traceback (exit 1).
    ("config nested 100000 deep", "config-text", "[" * 100000 + "]" * 100000,
     "lists and objects nest deeper than 32 levels"),
    ("job nested 40 deep", "job-text", '{"command": ["@MARKER@"], "environment": %s1%s}' % ('{"a": ' * 40, "}" * 40),
     "lists and objects nest deeper than 32 levels"),
    ("config not utf8", "config-bytes", b'{"backend": "\xff"}', "is not UTF-8 text"),
    ("config too large", "config-text", '{"backend": "@URL@", "pad": "%s"}' % ("x" * (1024 * 1024)),
     "is larger than 1048576 bytes"),
    ("defaults fail_open string", "defaults:fail_open", "yes", "fail_open: 'yes' must be true or false"),
    ("defaults on_contention", "defaults:on_contention", "queue", "on_contention: 'queue' must be one of"),
    ("defaults exit code 256", "defaults:exit_codes", {"locked": 256}, "exit_codes.locked: 256 is not an exit code"),
    ("defaults exit code bool", "defaults:exit_codes", {"locked": True}, "exit_codes.locked: True is not an exit code"),
    ("defaults exit code name", "defaults:exit_codes", {"nope": 1}, "unknown name 'nope'"),
    ("defaults ttl bool", "defaults:ttl", True, "ttl: True is not a duration"),
    ("defaults ttl list", "defaults:ttl", ["30s"], "is not a duration"),
    ("defaults kill_grace string NaN", "defaults:kill_grace", "NaN", "kill_grace: 'NaN' is not a duration"),
    # -- job file ------------------------------------------------------------------
    ("job command string", "job:command", "rm -rf /tmp/x", "list of strings (argv, no shell)"),
    ("job command empty list", "job:command", [], "no command"),
    ("job command empty program", "job:command", [""], "command[0]: the program must not be empty"),
    ("job command number", "job:command", ["/bin/echo", 1], "command[1]: 1 must be a string"),
    ("job command nested", "job:command", [["/bin/true"]], "command[0]: ['/bin/true'] must be a string"),
    ("job command NUL", "job:command", ["/bin/echo", "a\u0000b"], "command[1]: holds a NUL character"),
    ("job command NUL program", "job:command", ["/bin/true\u0000x"], "command[0]: holds a NUL character"),
    ("job env NUL", "job:environment", {"A": "x\u0000y"}, "environment.A: holds a NUL character"),
    ("job env number", "job:environment", {"A": 1}, "environment.A: 1 must be a string"),
    ("job env name =", "job:environment", {"A=B": "x"}, "not a valid environment variable name"),
    ("job env name newline", "job:environment", {"A\nB": "x"}, "holds a control character"),
    ("job env list", "job:environment", ["A=x"], "environment: ['A=x'] must be a mapping"),
    ("job workdir relative", "job:working_directory", "tmp", "working_directory: 'tmp' must be an absolute path"),
    ("job workdir newline", "job:working_directory", "/tmp\n", "holds a control character"),
    ("job workdir number", "job:working_directory", 5, "must be a string"),
    # Before the grant, naming the directory (the failure to start named the command).
    ("job workdir missing", "job:working_directory", "/nonexistent/dlock-workdir",
     "working_directory /nonexistent/dlock-workdir: is not a directory the job can enter"),
    ("job workdir a file", "job:working_directory", "/etc/hostname", "working_directory /etc/hostname: is not a directory the job can enter"),
    ("job key newline", "job:key", "a\nb", "key: 'a\\nb' holds a control character"),
    ("job key number", "job:key", 5, "key: 5 must be a string"),
    ("job key slash", "job:key", "a/b", "not a valid lock key"),
    ("job description newline", "job:description", "x\nExecStartPre=/bin/sh", "description:"),
    ("job description number", "job:description", 5, "description: 5 must be a string"),
    ("job ttl trailing newline", "job:ttl", "5m\n", "ttl: '5m\\n' is not a duration"),
    ("job ttl bool", "job:ttl", True, "ttl: True is not a duration"),
    ("job ttl negative number", "job:ttl", -30, "ttl: -30 is negative"),
    ("job once_per NaN", "job-text", '{"command": ["@MARKER@"], "once_per": NaN}', "NaN is not a number JSON allows"),
    ("job fail_open string", "job:fail_open", "true", "fail_open: 'true' must be true or false"),
    ("job unknown field", "job:tll", "5s", "unknown field 'tll'"),
    ("job duplicate key", "job-text", '{"command": ["@MARKER@"], "key": "a", "key": "b"}', "the key 'key' appears twice"),
    ("job top-level string", "job-text", '"ls"', "must hold a JSON object"),
    ("job budget", "job:renew_every", "25s", "must be below ttl (30s)"),
    # -- files that are not regular files ---------------------------------------------
    ("password fifo", "password-kind", "fifo", "is not a regular file"),
    ("password dev zero", "password-kind", "/dev/zero", "is not a regular file"),
    ("password directory", "password-kind", "dir", "is not a regular file"),
    ("password missing", "password-kind", "missing", "cannot read password file"),
    ("password empty", "password", b"", "is empty"),
    ("password two lines", "password", b"%s\nsecond\n" % SECRET.encode(), "holds more than one line"),
    ("password NUL", "password", b"%s\x00x" % SECRET.encode(), "holds more than one line or a control character"),
    ("password too large", "password", b"p" * 5000, "is larger than 4096 bytes"),
    ("password not utf8", "password", b"\xff\xfe", "is not UTF-8 text"),
    ("config flag relative", "flag:--config", "dlock.json", "--config: 'dlock.json' must be an absolute path"),
    ("url DEL", "flag:--backend", "redis://127.0.0.1:6379/0\x7f", "holds a control character"),
    ("url too long", "flag:--backend", "redis://" + "a" * 2100, "or is too long"),
    ("key C1 control", "flag:--key", "a\x85b", "holds a control character"),
    ("job command huge argument", "job:command", ["/bin/echo", "x" * 131073], "is longer than 131072"),
    ("defaults unknown option", "defaults:tll", "5s", "unknown field 'tll'"),
    ("job workdir percent", "job:working_directory", "/tmp/%h", "may hold only letters"),
    ("ca file fifo", "ca-kind", "fifo", "CA file"),
    ("ca file directory", "ca-kind", "dir", "is not a regular file"),
    ("config fifo", "config-kind", "fifo", "is not a regular file"),
    ("config dev zero", "config-kind", "/dev/zero", "is not a regular file"),
    ("config directory", "config-kind", "dir", "is not a regular file"),
    ("config missing", "config-kind", "missing", "cannot read"),
    ("job file fifo", "job-kind", "fifo", "is not a regular file"),
    ("job file dev zero", "job-kind", "/dev/zero", "is not a regular file"),
    # -- dlock run --rerun SLOT --reason TEXT (a job with once_per: 1h; the other flag good) --------
    ("rerun newline", "rerun", "2026-11-27T05:00:00Z\n", "--rerun: '2026-11-27T05:00:00Z\\n' holds a control character"),
    ("rerun C1 control", "rerun", "2026-11-27T05:00:00Z\x85", "holds a control character"),
    ("rerun NaN", "rerun", "NaN", "--rerun: 'NaN' is not a slot boundary"),
    ("rerun 1e308", "rerun", "1e308", "--rerun: '1e308' is not a slot boundary"),
    ("rerun epoch seconds", "rerun", "1795755600", "is not a slot boundary"),
    ("rerun not a time", "rerun", "yesterday", "is not a slot boundary"),
    ("rerun with an offset", "rerun", "2026-11-27T06:00:00+01:00", "is not a slot boundary"),
    ("rerun fullwidth digits", "rerun", "\uff12\uff10\uff12\uff16-11-27T05:00:00Z", "is not a slot boundary"),
    ("rerun february 30", "rerun", "2026-02-30T05:00:00Z", "is not a valid date and time"),
    ("rerun hour 24", "rerun", "2026-11-27T24:00:00Z", "is not a valid date and time"),
    ("rerun off the boundary", "rerun", "2026-11-27T05:30:00Z", "is not a boundary of the job's once_per (1h)"),
    ("rerun another job's run id", "rerun", "billing@2026-11-27T05:00:00Z", "is a run id of another job"),
    ("rerun too long", "rerun", "9" * 300, "is longer than"),
    ("rerun empty", "rerun", "", "--rerun: must not be empty"),
    ("rerun without once_per", "rerun-plain", "2026-11-27T05:00:00Z", "job hostile has no once_per"),
    ("rerun without reason", "reason", None, "--rerun and --reason go together"),
    ("reason without rerun", "rerun", None, "--rerun and --reason go together"),
    ("reason newline", "reason", "outage\n{\"result\": \"success\"}", "--reason: 'outage\\n"),
    ("reason escape", "reason", "out\x1b[2Jage", "holds a control character"),
    ("reason line separator", "reason", "out\u2028age", "holds a control character"),
    ("reason blank", "reason", "   ", "--reason: must say why"),
    ("reason empty", "reason", "", "--reason: must not be empty"),
    ("reason too long", "reason", "x" * 501, "is longer than 500 characters"),
]


def _special_file(tmp_path, kind, name):
    """A path of the given kind: fifo, dir, missing, or a device path."""
    if kind.startswith("/"):
        return kind
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    return str(path)


class Setup(object):
    """The files of one case; everything valid but the one hostile value."""

    def __init__(self, tmp_path, url):
        self.tmp = tmp_path
        self.url = url
        self.jobs = tmp_path / "jobs"
        self.jobs.mkdir()
        self.metrics = tmp_path / "metrics"
        self.metrics.mkdir()
        self.marker = tmp_path / "job-ran"
        self.config_path = str(tmp_path / "dlock.json")
        self.job_path = self.jobs / (JOB + ".json")
        self.config = {"backend": url, "metrics_dir": str(self.metrics), "defaults": {"fail_open": True}}
        self.job = dict(GOOD_JOB)
        self.flags = []
        self.config_text = self.job_text = None
        self.config_special = False

    def apply(self, where, value):
        kind, _sep, field = where.partition(":")
        if kind == "flag":
            self.flags.append(field + "=" + value)  # '=': a value starting with '-' stays a value
        elif kind == "config":
            self.config[field] = value
        elif kind == "defaults":
            self.config["defaults"][field] = value
        elif kind == "job":
            self.job[field] = value
        elif kind == "config-text":
            self.config_text = value
        elif kind == "config-bytes":
            self.config_text = value
        elif kind == "job-text":
            self.job_text = value
        elif kind == "password":
            path = self.tmp / "password"
            path.write_bytes(value)
            self.config["password_file"] = str(path)
        elif kind == "password-kind":
            self.config["password_file"] = _special_file(self.tmp, value, "password")
        elif kind == "ca-kind":
            self.config["ca_file"] = _special_file(self.tmp, value, "ca")
        elif kind == "config-kind":
            self.config_path = _special_file(self.tmp, value, "config-special")
            self.config_special = True
        elif kind in ("rerun", "reason", "rerun-plain"):
            # A rerun of the job (with once_per, but for rerun-plain), the other flag good; None: not given.
            given = {"rerun": "2026-11-27T05:00:00Z", "reason": "provider outage"}
            given[kind.split("-")[0]] = value
            if kind != "rerun-plain":
                self.job["once_per"] = "1h"
            self.flags += ["--%s=%s" % item for item in sorted(given.items()) if item[1] is not None]
        elif kind == "job-kind":
            os.rmdir(self.jobs)
            self.jobs.mkdir()
            if value.startswith("/"):
                os.symlink(value, self.job_path)
            else:
                _special_file(self.jobs, value, JOB + ".json")

    def write(self):
        marker_cmd = ["/usr/bin/touch", str(self.marker)]
        if not self.config_special:
            text = self.config_text if self.config_text is not None else json.dumps(self.config)
            if isinstance(text, bytes):
                open(self.config_path, "wb").write(text)
            else:
                open(self.config_path, "w").write(text.replace("@URL@", self.url))
        if not os.path.lexists(self.job_path):
            if self.job_text is not None:
                text = self.job_text.replace('["@MARKER@"]', json.dumps(marker_cmd))
            else:
                job = dict(self.job)
                if job.get("command") == ["@MARKER@"]:
                    job["command"] = marker_cmd
                text = json.dumps(job)
            self.job_path.write_text(text)


@pytest.fixture(scope="module")
def backend(redis_server):
    engine = open_backend(redis_server.url)
    yield engine
    engine.close()


@pytest.mark.parametrize("case_id, where, value, fragment", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_and_changes_nothing(case_id, where, value, fragment, redis_server, backend,
                                                      tmp_path):
    key = "hostile-%s" % abs(hash(case_id))
    before = backend.acquire(key, OTHER, 120)
    assert before.granted
    setup = Setup(tmp_path, redis_server.url)
    setup.job["key"] = key
    setup.apply(where, value)
    setup.write()
    argv = ["run", "--job", JOB, "--config", setup.config_path, "--jobs-dir", str(setup.jobs)]
    if where == "flag:--job":
        argv = ["run", "--config", setup.config_path, "--jobs-dir", str(setup.jobs)]
    try:
        done = run_dlock(*(argv + setup.flags), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the runner hung on %s" % case_id)
    out = done.stdout + done.stderr
    assert done.returncode == 78, out
    assert fragment in done.stderr, out
    assert "Traceback" not in out
    assert SECRET not in out
    if where.startswith(("job", "config", "defaults")) and where != "flag:--config":
        # Errors in a file name the file.
        named = setup.config_path if where.startswith(("config", "defaults")) else str(setup.job_path)
        assert named in done.stderr, out
    assert not setup.marker.exists(), "the job ran"
    assert os.listdir(setup.metrics) == [], "metrics were written"
    holder = backend.query(key)
    assert (holder.owner, holder.fence) == (OTHER, before.fence)
    backend.release(key, OTHER)


def test_every_case_has_its_own_id():
    assert len({c[0] for c in CASES}) == len(CASES) >= 150


def test_a_fifo_password_file_is_refused_without_a_writer(redis_server, tmp_path):
    """The FIFO case above, looked at directly: it is still a FIFO after the
    runner refused it (nothing replaced it), and no reader waits on it."""
    fifo = tmp_path / "pw"
    os.mkfifo(fifo)
    done = run_dlock("status", "--backend", redis_server.url, "--password-file", str(fifo), "--key", "x",
                     timeout=20)
    assert done.returncode == 78 and "is not a regular file" in done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_status_of_a_job_that_does_not_exist_says_so(redis_server, tmp_path):
    done = run_dlock("status", "--job", "no-such-job", "--backend", redis_server.url, "--jobs-dir", str(tmp_path),
                     timeout=20)
    assert done.returncode == 78
    assert "job file %s" % (tmp_path / "no-such-job.json") in done.stderr
    assert "No such file" in done.stderr


def test_release_reason_with_a_line_break_is_refused(redis_server, backend):
    assert backend.acquire("hostile-reason", OTHER, 60).granted
    done = run_dlock("release", "--key", "hostile-reason", "--force", "--reason", "stale\n{\"result\": \"success\"}",
                     "--backend", redis_server.url, timeout=20)
    assert done.returncode == 78 and "--reason" in done.stderr and "control character" in done.stderr
    assert backend.query("hostile-reason").owner == OTHER
    backend.release("hostile-reason", OTHER)
