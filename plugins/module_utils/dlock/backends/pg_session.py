"""The PostgreSQL session of a backend: which host, how each call is bounded
by op_timeout, and whether a write counts.

Connections are autocommit, never use server-side prepared statements (so they
work through PgBouncer in transaction mode) and carry TCP keepalives and a TCP
user timeout, so a dead peer is noticed in seconds rather than hours.

High availability (Patroni, synchronous replication): the URL may list several
hosts; they are tried in order and only a read-write server is accepted
(target_session_attrs=read-write, always), so a failover is a reconnect. A
write counts only when its commit is known to be synchronously replicated
(see CommitUnknown).
"""

import math
import os
import socket  # psycopg imports it anyway: no cost at start
import threading
import time

from ..errors import AuthError, BackendError, OutcomeUnknown
from ..validate import backend_url
from ..watchdog import Watchdog
from .base import endpoint

try:
    import psycopg
except ImportError:
    psycopg = None


class CommitUnknown(OutcomeUnknown):
    """A write may be committed on the primary without being synchronously
    replicated, or may not be committed at all: it cannot be counted."""


def _commit_warning(notices):
    """The server's words when a write's commit was acknowledged without the
    synchronous standby's confirmation, else None.

    When the wait for the standby is cancelled (our op_timeout cancel request,
    or pg_terminate_backend), PostgreSQL acknowledges the commit with a WARNING
    "canceling wait for synchronous replication due to user request" / "The
    transaction has already committed locally, but might not have been
    replicated to the standby." (src/backend/replication/syncrep.c). It has no
    SQLSTATE of its own (the generic 01000; 57P01 when terminated) and its text
    follows lc_messages, which only a superuser may set. So the text is never
    matched: any WARNING during a write means the write is not vouched for.
    The writes (lease upsert, slot claim, renew, release) raise no other
    warning, so this only ever fails closed."""
    for severity, message, detail in notices:
        if severity == "WARNING":
            return "%s (%s)" % (message, detail) if detail else message
    return None


def _ms(seconds):
    return int(math.ceil(seconds * 1000))


def shutdown_grace(op_timeout):
    """How long past op_timeout a call may go on before its socket is shut
    down: the time the cancel request gets to end it (a statement, a commit's
    wait for the standby, which then answers with the warning that says the
    commit is not replicated). Half the op_timeout, at most a second."""
    return min(op_timeout / 2.0, 1.0)


class PgConnector(object):
    """Opens a read-write session on the URL's hosts: the one that gave the
    last one first. on_notice and on_notify are the connection's handlers."""

    def __init__(self, url, password, op_timeout, ca_file, on_notice, on_notify):
        self.url = url
        # [(host, port or None)] in the URL's order; the one that gave the
        # last read-write session is tried first.
        self.hosts = backend_url(url).hosts
        self._current = 0
        self.password = password
        self.op_timeout = op_timeout
        self.ca_file = ca_file
        self._on_notice = on_notice
        self._on_notify = on_notify

    def connect(self):
        """A read-write session on the first host that gives one, within
        op_timeout for all the hosts tried. With several hosts we try them
        one by one, each with an equal share of what is left (as etcd's
        members): handed the whole list, libpq (waited on by psycopg) can
        spend the whole op_timeout on a host that never answers, such as a
        partitioned former primary, and never ask the new primary behind
        it. A wrong password is the same on every host: it ends the try."""
        deadline = time.monotonic() + self.op_timeout
        count = len(self.hosts)
        errors = []
        for number in range(count):
            index = (self._current + number) % count
            left = deadline - time.monotonic()
            if left <= 0:
                break
            host, port = self.hosts[index]
            try:
                conn = self._connect_to(host, port, left / (count - number))
            except AuthError:
                raise
            except BackendError as exc:
                errors.append(("%s: %s" % (endpoint(host, port or 5432), exc)) if count > 1 else str(exc))
                continue
            self._current = index
            return conn
        raise BackendError("postgresql: cannot connect (%s)" % ("; ".join(errors) or "no time left"))

    def _connect_options(self, host, port, timeout):
        """psycopg.connect's options for one host, over the URL's."""
        kwargs = dict(
            # This host only (the URL's list is tried by connect); an empty
            # port is libpq's default.
            host=host, port=str(port or ""),
            autocommit=True,
            prepare_threshold=None,
            application_name="dlock",
            # libpq counts connect_timeout in whole seconds and treats < 2 as 2.
            connect_timeout=max(2, int(math.ceil(timeout))),
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
            tcp_user_timeout=_ms(self.op_timeout),
            # A lock is only ever taken on a server that takes writes: with
            # several hosts (h1,h2,h3) a standby is passed over (connect
            # goes on to the next); with one, a standby is an error, not a lock.
            # This overrides the URL, which validate.py limits to read-write.
            target_session_attrs="read-write",
        )
        if self.password is not None:
            kwargs["password"] = self.password
        if self.ca_file:
            kwargs["sslrootcert"] = self.ca_file
        return kwargs

    def _connect_to(self, host, port, timeout):
        try:
            conn = psycopg.connect(self.url, **self._connect_options(host, port, timeout))
        except psycopg.OperationalError as exc:
            text = str(exc).strip()
            if "password authentication failed" in text or "no password supplied" in text:
                raise AuthError("postgresql: authentication failed (%s)" % text.splitlines()[0])
            raise BackendError(text.splitlines()[0] if text else str(exc))
        except psycopg.Error as exc:
            raise BackendError(str(exc).strip() or exc.__class__.__name__)
        conn.add_notice_handler(self._on_notice)
        conn.add_notify_handler(self._on_notify)
        try:
            # A client_min_messages set for the role or the database above
            # WARNING would hide an unreplicated commit from us.
            conn.execute("SET client_min_messages = warning")
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(str(exc).strip() or exc.__class__.__name__)
        return conn


class PgSession(object):
    """One read-write session at a time, opened on first use and again after
    reset(). ensure_schema(conn, upgrade) makes or upgrades the lease tables;
    on_notify(payload) gets the notifications that come with an answer.

    schema_first: look for the lease tables before the first call (True), or
    create them only when a call finds one missing, and then do it again.
    Doing it again is safe only where a call leaves nothing behind when it
    fails: not the advisory lock, taken outside any transaction."""

    def __init__(self, url, password, op_timeout, ca_file, ensure_schema, on_notify, schema_first=False):
        self._connector = PgConnector(url, password, op_timeout, ca_file, self._on_notice, self._on_notify)
        self.op_timeout = op_timeout
        self._ensure_schema = ensure_schema
        self._on_notify_payload = on_notify
        self.schema_first = schema_first
        self._conn = None
        self._schema_ready = self._upgraded = False
        # (severity, message, detail) of the notices of the current operation
        self._notices = []
        self._watchdog = Watchdog("dlock-pg-cancel")
        self._grace = shutdown_grace(op_timeout)
        # Held to shut a socket down and to close a connection: a socket is
        # never shut down after its descriptor was closed, and maybe reused.
        self._closing = threading.Lock()
        self._shut = None  # the connection whose socket the last resort shut down
        self.listening = None  # the connection whose session LISTENs, while we wait
        # A connection reset() must not close (it holds a session's advisory
        # lock): forgotten, left open until close_pinned().
        self.pinned = None

    @property
    def conn(self):
        """The session's connection, opened (again) when there is none."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connector.connect()
        return self._conn

    @property
    def current(self):
        """The connection in use, as it is (None after a reset); opens none."""
        return self._conn

    def _on_notice(self, diag):
        # Copied out: the Diagnostic is only valid during the callback.
        self._notices.append((diag.severity_nonlocalized, diag.message_primary, diag.message_detail))

    def _on_notify(self, notify):
        # Notifications that arrive with a statement's answer (psycopg hands
        # them here); wait_change reads the ones that arrive while it waits.
        self._on_notify_payload(notify.payload)

    # -- op_timeout -------------------------------------------------------
    def _cancel(self, conn):
        """Ask the server to cancel what conn is running (the op_timeout)."""
        try:
            if hasattr(conn, "cancel_safe"):  # psycopg >= 3.2: bounded, non-blocking with libpq >= 17
                conn.cancel_safe(timeout=self.op_timeout)
            else:
                conn.cancel()
        except Exception:  # a closed connection, an unreachable server
            pass  # nothing more to do here: TCP timeouts and the caller's deadline remain

    def _shut_down(self, conn):
        """The last resort of op_timeout: shut the connection's socket down, so
        the call waiting on it fails at once. A cancel request is acted on by
        the server process; one that does not run (stopped, stuck in the
        kernel on a hung disk) never acts on it, while its kernel still
        acknowledges our packets (so neither the TCP user timeout nor the
        keepalives end the wait). Shut down on a duplicate of libpq's
        descriptor: the socket is shared, libpq's descriptor stays its own.
        The connection is never used again (_bounded resets it)."""
        with self._closing:
            if conn.closed:
                return
            try:
                sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
            except (psycopg.Error, OSError, ValueError):
                return  # no socket left to shut down
            try:
                self._shut = conn
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected
            finally:
                sock.close()

    def _bounded(self, conn, fn):
        """fn(conn), with a cancel request sent if it runs past op_timeout,
        and its socket shut down if it still runs a grace later (_shut_down).

        op_timeout is enforced by a cancel request from the client, not by
        statement_timeout: the server stops counting statement_timeout before
        the commit, so it never ends a commit's wait for the synchronous
        standby, which with a strict synchronous setup and no standby lasts
        for ever. A cancel does end it: the commit is then acknowledged with
        a warning (see _commit_warning)."""
        self._shut = None
        self._watchdog.arm(self.op_timeout, lambda: self._cancel(conn),
                           then=(self._grace, lambda: self._shut_down(conn)))
        del self._notices[:]
        try:
            return self._with_schema(conn, fn)
        finally:
            fired = self._watchdog.disarm()
            if fired:
                self.reset()  # the cancel request may land on our next statement: start afresh

    def _with_schema(self, conn, fn):
        """fn(conn), the lease tables made or brought up to date when missing."""
        if self.schema_first and not self._schema_ready:
            self._make_schema(conn)
        try:
            return fn(conn)
        except psycopg.errors.UndefinedTable:
            # A database the lease tables were never created in: create
            # them (a CREATE TABLE commits: under the op_timeout too) and
            # do it again. Nothing was written: the statement that named
            # a missing table was refused whole, and a transaction
            # around it rolled back. Asked only then, not on every
            # connection: a round trip less for each start of a runner.
            if self._schema_ready:
                raise
            self._make_schema(conn)
            return fn(conn)
        except psycopg.errors.UndefinedColumn:
            # Tables made by an earlier version: the same, once per backend.
            if self._upgraded:
                raise
            self._upgraded = True
            self._make_schema(conn, upgrade=True)
            return fn(conn)

    def _make_schema(self, conn, upgrade=False):
        self._ensure_schema(conn, upgrade)
        self._schema_ready = True

    def run(self, fn, write=False):
        """Run fn(conn) within op_timeout and turn driver errors into
        BackendError; a broken connection is dropped so the next call reconnects.
        write=True: fn commits something that counts only once it is known to
        be synchronously replicated; otherwise CommitUnknown is raised."""
        try:
            result = self._bounded(self.conn, fn)
        except psycopg.errors.QueryCanceled:
            # An ERROR, not the commit's warning: the statement and its transaction were rolled back.
            self.reset()
            raise BackendError("postgresql: no answer within op_timeout (%gs); cancelled" % self.op_timeout)
        except psycopg.OperationalError as exc:
            self.reset()
            text = str(exc).strip() or exc.__class__.__name__
            if self._shut is not None:
                text = ("no answer within op_timeout (%gs), nor to the cancel request within %gs more; "
                        "the connection was shut down (%s)" % (self.op_timeout, self._grace, text))
            if write:  # the connection was lost before or after the commit: nobody can tell
                raise CommitUnknown("postgresql: the outcome of the write is unknown: %s" % text)
            raise BackendError("postgresql: %s" % text)
        except psycopg.Error as exc:
            raise BackendError("postgresql: %s" % str(exc).strip())
        warning = _commit_warning(self._notices) if write else None
        if warning:
            self.reset()
            raise CommitUnknown("postgresql: the commit is not known to be replicated to a synchronous standby: %s"
                                % warning)
        return result

    # -- ending -----------------------------------------------------------
    def reset(self):
        """Stop using the current connection, and close it unless it is the
        pinned one (left open: closing it would end its session)."""
        self.listening = None
        conn, self._conn = self._conn, None
        if conn is not None and conn is not self.pinned:
            self._close(conn)

    def close_pinned(self):
        """Close the pinned connection, if any: its session ends now."""
        conn, self.pinned = self.pinned, None
        if conn is not None:
            self._close(conn)

    def _close(self, conn):
        with self._closing:
            try:
                conn.close()  # psycopg takes no lock here: an abandoned call does not hold it up
            except Exception:  # a stuck or broken connection: nothing left to save
                pass
