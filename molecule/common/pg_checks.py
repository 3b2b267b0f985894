"""What the PostgreSQL scenarios' checks share (molecule/postgresql: one
server; molecule/postgresql-ha: a Patroni cluster): a query as the
superuser, and a statement as the runners' role through the node's own URL.
The checks are tests/test_pg_members.py and tests/test_pg_runners.py beside
this file.
"""

import json
import re

# As the runners' role, through the node's own backend URL: the password from
# the node's file, through the environment (never on the command line).
AS_RUNNER = 'PGPASSWORD="$(cat /etc/dlock/backend.password)" psql -XAtq %s -c %s'


def sql(host, query, database="dlock"):
    """A query as the postgres superuser (peer authentication on the socket)."""
    return host.check_output("runuser -u postgres -- psql -XAtq -d %s -c %s", database, query)


def _runner_config(host):
    return json.loads(host.file("/etc/dlock/dlock.json").content_string)


def runner_url(host, database="dlock"):
    """The node's backend URL (dlock.json), for this database."""
    return re.sub(r"/dlock(\?|$)", "/%s\\1" % database, _runner_config(host)["backend"])


def advisory_url(host):
    """The node's backend URL with the session advisory-lock scheme, its TLS
    settings kept (the runner takes the CA from dlock.json, as for its own)."""
    return runner_url(host).replace("postgresql://", "postgresql+advisory://", 1)


def as_runner(host, statement, database="dlock"):
    """psql as the runners' role through the node's URL; over TLS with the
    node's CA (libpq reads sslrootcert, not the runner's ca_file)."""
    config, url = _runner_config(host), runner_url(host, database)
    if config.get("ca_file") and "sslmode=" in url:
        url += "&sslrootcert=" + config["ca_file"]
    return host.run(AS_RUNNER, url, statement)
