"""Real redis-server, PostgreSQL and etcd instances on loopback for tests and benchmarks.

Each server gets a free port and a private temp directory; stop() removes
both. PostgreSQL refuses to run as root, so it runs as the 'postgres' user
that Debian's package creates.
"""

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

PG_BIN = "/usr/lib/postgresql/15/bin"


def signal_processes(pids, sig):
    """Send SIG to each of PIDS that still runs. A server's processes come and
    go (a session that just closed): one that exited meanwhile has nothing to
    stop or to wake, and is skipped rather than failing the test."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def url_of(request, kind, tmp_path):
    """The URL of a backend of `kind` (a scheme: redis, postgresql,
    postgresql+advisory, etcd, file) for a test: the session's server of
    that kind (conftest.py's fixtures), or a lock directory in tmp_path."""
    if kind == "file":
        return "file://%s" % (tmp_path / "locks")
    if kind == "redis":
        return request.getfixturevalue("redis_server").url
    if kind == "etcd":
        return request.getfixturevalue("etcd_server").url
    return request.getfixturevalue("pg_server").url(scheme=kind)


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by this process: a server gets its port only after it
# starts, so two servers started together must not be given the same one.
_HANDED_OUT = set()


def free_port():
    """A loopback port nothing listens on, below the kernel's ephemeral range.

    bind(port 0) would pick one inside that range, where any outgoing
    connection of the busy machine (the other CI lanes, a test's own clients)
    may take it before the server binds it: CI lost an etcd cluster to that
    ("server exited with 1"). Below the range only a listener can hold it."""
    rng = random.SystemRandom()
    high = _ephemeral_low() - 1
    for _attempt in range(200):
        port = rng.randint(min(15000, high - 1000), high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port below %d" % (high + 1))


def _wait_port(port, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("port %d did not open" % port)


class RedisServer(object):
    def __init__(self, password=None, extra=()):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="dlock-redis-")
        self.password = password
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
                "--maxmemory-policy", "noeviction", "--loglevel", "warning"]
        if password:
            args += ["--requirepass", password]
        self.proc = subprocess.Popen(args + list(extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    @property
    def pid(self):
        return self.proc.pid

    def client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, decode_responses=True)

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self):
        """Stop and start on the same port and data dir (AOF keeps the data)."""
        self.proc.terminate()
        self.proc.wait(10)
        args = self.proc.args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresServer(object):
    """A throwaway cluster: database 'dlock', superuser 'postgres', a password
    login role 'locker' (scram-sha-256) for password tests."""

    def __init__(self, password="locker-secret"):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="dlock-pg-")
        self.password = password
        user = pwd.getpwnam("postgres")
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.data = os.path.join(self.dir, "data")
        self._as_postgres([PG_BIN + "/initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
                           "--no-sync", "-E", "UTF8"])
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as hba:
            # postgres may also stream WAL to a standby (PostgresStandby).
            hba.write("local all postgres trust\nhost all postgres 127.0.0.1/32 trust\n"
                      "host replication postgres 127.0.0.1/32 trust\n"
                      "host all all 127.0.0.1/32 scram-sha-256\n")
        self.start()
        self.sql("CREATE DATABASE dlock")
        self.sql("CREATE ROLE locker LOGIN PASSWORD '%s'; GRANT ALL ON DATABASE dlock TO locker" % password)
        self.sql("GRANT ALL ON SCHEMA public TO locker", db="dlock")

    def start(self):
        """Start the server on its port and data directory (again, after halt())."""
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", PG_BIN + "/postgres", "-D", self.data, "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + self.dir,
             "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)
        self._wait_accepting()

    def _wait_accepting(self, timeout=30.0):
        """The port opens before the server takes connections ("the database
        system is starting up", a standby until it is consistent)."""
        import psycopg
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.connect("postgres").close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def halt(self):
        """Stop the server at once (immediate mode); its data directory stays for start()."""
        subprocess.run(["runuser", "-u", "postgres", "--", PG_BIN + "/pg_ctl", "-D", self.data, "-m", "immediate",
                        "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def _as_postgres(self, argv):
        subprocess.run(["runuser", "-u", "postgres", "--"] + argv, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def url(self, user="postgres", scheme="postgresql"):
        return "%s://%s@127.0.0.1:%d/dlock" % (scheme, user, self.port)

    def connect(self, db="dlock"):
        import psycopg
        return psycopg.connect("postgresql://postgres@127.0.0.1:%d/%s" % (self.port, db), autocommit=True)

    def sql(self, statement, db="postgres"):
        with self.connect(db) as conn:
            return conn.execute(statement).fetchall() if statement.lstrip().upper().startswith("SELECT") \
                else conn.execute(statement)

    def backend_pids(self, application_name="dlock"):
        with self.connect() as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                (application_name,)).fetchall()
        return [row[0] for row in rows]

    def all_pids(self):
        """The postmaster and every child of it."""
        out = subprocess.run(["pgrep", "-f", "-u", "postgres", ""], capture_output=True, text=True,
                             check=False).stdout
        mine = []
        for pid in (int(p) for p in out.split()):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as handle:
                    cmd = handle.read()
                with open("/proc/%d/status" % pid) as handle:
                    ppid = int([l for l in handle if l.startswith("PPid:")][0].split()[1])
            except OSError:
                continue
            if self.data.encode() in cmd or ppid == self.postmaster_pid:
                mine.append(pid)
        return mine

    @property
    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as handle:
            return int(handle.readline())

    def stop(self):
        if self.proc.poll() is None:  # running: wake any paused process so it can stop
            for pid in self.all_pids():
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)


class EtcdServer(object):
    """etcd (3.4, Debian's etcd-server) on loopback: one member, or a cluster
    of `members`, each with its own client and peer ports and data dir.
    `tls`: a directory with make_tls's files; the clients then speak HTTPS
    and must show a certificate signed by its CA."""

    def __init__(self, members=1, tls=None):
        self.dir = tempfile.mkdtemp(prefix="dlock-etcd-")
        self.tls = tls
        self.names = ["m%d" % i for i in range(members)]
        self.client_ports = [free_port() for _name in self.names]
        self.peer_ports = [free_port() for _name in self.names]
        cluster = ",".join("%s=http://127.0.0.1:%d" % (name, port) for name, port in zip(self.names, self.peer_ports))
        self.argv = []
        for index, name in enumerate(self.names):
            client = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.client_ports[index])
            peer = "http://127.0.0.1:%d" % self.peer_ports[index]
            self.argv.append(["etcd", "--name", name, "--data-dir", os.path.join(self.dir, name),
                              "--listen-client-urls", client, "--advertise-client-urls", client,
                              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                              "--initial-cluster", cluster, "--initial-cluster-state", "new",
                              "--initial-cluster-token", os.path.basename(self.dir)] + self._tls_flags("server"))
        self.procs = [None] * members
        for index in range(members):
            self.start_member(index, wait=False)
        for index in range(members):
            _wait_port(self.client_ports[index], self.procs[index])
        self.wait_healthy()

    def _tls_flags(self, side):
        """etcd's (side "server") or etcdctl's ("client") TLS flags."""
        if not self.tls:
            return []
        files = dict((name, os.path.join(self.tls, name + ".pem")) for name in ("ca", "server", "client"))
        if side == "server":
            return ["--cert-file", files["server"], "--key-file", os.path.join(self.tls, "server.key"),
                    "--trusted-ca-file", files["ca"], "--client-cert-auth"]
        return ["--cacert", files["ca"], "--cert", files["client"], "--key", os.path.join(self.tls, "client.key")]

    @property
    def url(self):
        return "%s://%s/dlock" % ("etcd+https" if self.tls else "etcd",
                                  ",".join("127.0.0.1:%d" % port for port in self.client_ports))

    def member_url(self, index):
        return "etcd://127.0.0.1:%d/dlock" % self.client_ports[index]

    def start_member(self, index, wait=True):
        self.procs[index] = subprocess.Popen(self.argv[index], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait:
            _wait_port(self.client_ports[index], self.procs[index])
            self.wait_healthy()

    def stop_member(self, index):
        proc = self.procs[index]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)

    def restart(self):
        """Stop every member and start them again on the same data dirs."""
        for index in range(len(self.names)):
            self.stop_member(index)
        for index in range(len(self.names)):
            self.start_member(index, wait=False)
        for index in range(len(self.names)):
            _wait_port(self.client_ports[index], self.procs[index])
        self.wait_healthy()

    def etcdctl(self, *args, user=None):
        """etcdctl against the live members; returns its stdout (raises on failure)."""
        live = ",".join("127.0.0.1:%d" % port for port, proc in zip(self.client_ports, self.procs)
                        if proc is not None and proc.poll() is None)
        argv = (["etcdctl", "--endpoints", live, "--command-timeout", "10s"] + (["--user", user] if user else [])
                + self._tls_flags("client"))
        return subprocess.run(argv + list(args), env=dict(os.environ, ETCDCTL_API="3"), capture_output=True,
                              text=True, check=True, timeout=30).stdout

    def wait_healthy(self, timeout=30.0):
        """Until the cluster has a leader and serves a linearizable read."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.etcdctl("get", "--consistency=l", "/health-probe")
                return
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self):
        for index in range(len(self.names)):
            self.stop_member(index)
        shutil.rmtree(self.dir, ignore_errors=True)


def make_tls(directory):
    """In DIRECTORY: a CA (ca.pem), a server certificate for 127.0.0.1 (an IP
    SAN) and a client certificate signed by it (server.pem/.key,
    client.pem/.key), and another CA that signed neither (other-ca.pem)."""
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=directory, check=True, capture_output=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *key, "-days", "2", "-subj", "/CN=dlock test %s" % ca, "-keyout", ca + ".key",
                "-out", ca + ".pem")
    with open(os.path.join(directory, "san.ext"), "w") as handle:
        handle.write("subjectAltName = IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", *key, "-subj", "/CN=dlock test %s" % name, "-keyout", name + ".key", "-out", name + ".csr")
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", "san.ext", "-out", name + ".pem")


class PgBouncer(object):
    """PgBouncer (Debian's) in transaction pooling in front of a PostgresServer's
    database 'dlock', as user postgres: a client's transactions share a small
    pool of server sessions, as on a pooled fleet."""

    def __init__(self, server, pool_size=2):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="dlock-pgbouncer-")
        user = pwd.getpwnam("postgres")
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        config = os.path.join(self.dir, "pgbouncer.ini")
        with open(config, "w") as handle:
            handle.write("[databases]\ndlock = host=127.0.0.1 port=%d dbname=dlock user=postgres\n"
                         "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n"
                         "auth_type = any\npool_mode = transaction\ndefault_pool_size = %d\n"
                         "max_client_conn = 100\nlogfile = %s\n"
                         % (server.port, self.port, pool_size, os.path.join(self.dir, "pgbouncer.log")))
        # It refuses to run as root.
        self.proc = subprocess.Popen(["runuser", "-u", "postgres", "--", "pgbouncer", config],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)

    def url(self):
        return "postgresql://postgres@127.0.0.1:%d/dlock" % self.port

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresStandby(PostgresServer):
    """A hot standby streaming from a PostgresServer (pg_basebackup -R): the
    same roles and data, read-only, on its own port."""

    def __init__(self, primary):  # copies the primary: no initdb
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="dlock-pg-standby-")
        self.password = primary.password
        user = pwd.getpwnam("postgres")
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.data = os.path.join(self.dir, "data")
        self._as_postgres([PG_BIN + "/pg_basebackup", "-D", self.data, "-h", "127.0.0.1", "-p", str(primary.port),
                           "-U", "postgres", "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"])
        self.start()


class PostgresSyncPair(object):
    """A primary and one standby with strict synchronous replication, as
    Patroni's synchronous_mode_strict leaves it: synchronous_standby_names = '*'
    and synchronous_commit = on, so a commit waits for the standby, and waits
    for ever while no standby is connected."""

    def __init__(self):
        self.primary = PostgresServer()
        try:
            self.standby = PostgresStandby(self.primary)
            self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.primary.sql("ALTER SYSTEM SET synchronous_commit = 'on'")
            self.primary.sql("SELECT pg_reload_conf()")
            self.wait_synchronous()
        except BaseException:
            self.primary.stop()
            raise

    def synchronous(self):
        """True when the primary has a synchronous standby streaming to it."""
        rows = self.primary.sql("SELECT count(*) FROM pg_stat_replication "
                                "WHERE state = 'streaming' AND sync_state = 'sync'")
        return rows[0][0] > 0

    def wait_synchronous(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not self.synchronous():
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become synchronous within %gs" % timeout)
            time.sleep(0.05)

    def standby_down(self):
        self.standby.halt()
        deadline = time.monotonic() + 30
        while self.synchronous():  # the primary notices the walsender's end
            if time.monotonic() > deadline:
                raise RuntimeError("the primary still reports a synchronous standby")
            time.sleep(0.05)

    def standby_up(self):
        if self.standby.proc.poll() is not None:
            self.standby.start()
        self.wait_synchronous()

    def stop(self):
        self.standby.stop()
        self.primary.stop()


@contextlib.contextmanager
def every_backend(prefix):
    """The backends the benchmarks compare side by side, {name: URL}: a
    3-member etcd, Redis, PostgreSQL and file:// in a directory of its own;
    all stopped, and the directory removed, at the end."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    started = []
    try:
        etcd = EtcdServer(members=3)
        started.append(etcd)
        redis_server = RedisServer()
        started.append(redis_server)
        pg = PostgresServer()
        started.append(pg)
        yield {"etcd (3 members)": etcd.url, "redis": redis_server.url, "postgresql": pg.url(),
               "file": "file://%s/locks" % workdir}
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
