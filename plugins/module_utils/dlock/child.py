"""The job's processes: the whole tree ends with the run, however the runner ends.

    runner ── guard (own session, child subreaper) ── job (own process group) ── ...

The runner forks a guard (a copy of itself, no new interpreter: ~1ms), which
starts the job and waits for it. PR_SET_PDEATHSIG reaches only a direct
child, so it cannot protect a shell's children; the guard can:
- it is a child subreaper (PR_SET_CHILD_SUBREAPER), so whatever the job
  leaves behind (a background process, a double fork, a `setsid` escape
  from the job's process group or session) is re-parented to it, not to
  init: every process the job started stays a descendant of the guard;
- it holds one end of a unix socket whose other end only the runner has:
  end of file means the runner is gone, whatever ended it (SIGKILL, a crash,
  the OOM killer), so the guard then kills all its descendants and exits;
- it keeps what the backend says must outlive the runner until nothing of
  the job is left (Backend.guard_fds: a file:// lock's descriptor, an
  advisory lock's session socket, passed over that socket when the job
  starts; the guard never reads or writes them), so a lock that goes with
  its last descriptor is not freed by the runner's death while the job runs;
- when the job ends by itself, the guard kills what the job left behind
  before it reports the job's status, so nothing of a run outlives its lease;
- the job gets PR_SET_PDEATHSIG=SIGKILL towards the guard, in case the
  guard itself is killed.
Where the runner may create a cgroup v2 below its own (root on a cgroup2
mount; a systemd unit with Delegate=yes), the job runs in a cgroup of its
own, and the guard kills it with cgroup.kill (kernel >= 5.14): atomic, no
race with a job that forks while it is being killed, and the runner uses it
too when the guard itself died. DLOCK_CGROUP=off turns the cgroup off.

The guard is started first thing in `dlock run` (Child.prepare), before the
runner loads its modules or asks the backend, and forks at once the job's
process, which takes its process group, its parent-death signal and its
cgroup and then waits for the command (Child.start, after the grant; a run
with no job dismisses it). Moving a process into a cgroup waits for an RCU
grace period (15 ms here, the longest single step of a start); it is spent
while the runner works, not after the grant, and so are the guard's own
start and its import of ctypes. Forked before the runner has any thread,
connection or flock, the guard inherits none of them.

A lock's descriptor so comes to the guard after the grant, over the life
socket (SCM_RIGHTS), before the job's command is written: from then on the
guard, or the socket's queue while the message is in flight, holds the lock
for as long as any of the job may run. The job's process was forked before
(at prepare), so neither it nor anything it starts can inherit that
descriptor. Forking the guard at the grant instead would be as simple but
would put the guard's start and the cgroup move back after the grant.
"""

import errno
import os
import select
import signal
import sys

# The C module under `socket`: a unix socket pair and SCM_RIGHTS are all the
# guard needs, and `import socket` (with selectors) costs every run ~3 ms.
import _socket

from .boottime import now

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# Bound of the guard's killing (a fork bomb outside a cgroup can keep it busy).
KILL_SECONDS = 5.0
# Signals the guard survives: they are for the job (the runner forwards them to
# its group; systemd sends SIGTERM to every process of the unit).
IGNORED_BY_GUARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# Most descriptors one run passes to its guard (a backend has one lock a key):
# the guard's receive buffer is sized for them, and more would be cut off.
MAX_GUARD_FDS = 8
_INT_BYTES = 4  # a C int, as SCM_RIGHTS carries descriptors


def exit_status(returncode):
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _returncode(status):
    """A wait status as Popen.returncode: -N when killed by signal N."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _prctl():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None  # not Linux: no subreaper, no parent-death signal


# -- cgroup v2 ------------------------------------------------------------------
def _own_cgroup():
    """Directory of this process's cgroup v2, or None (no cgroup2 mount, or v1 only)."""
    try:
        with open("/proc/self/cgroup") as handle:
            path = next((line[3:].rstrip("\n") for line in handle if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as handle:
            # fields: ... mount point (5th) ... " - " fstype source options
            mounts = [line.split()[4] for line in handle if " - cgroup2 " in line]
    except (IOError, OSError):
        return None
    if path is None or not mounts or not path.startswith("/"):
        return None
    return mounts[0] + path.rstrip("/")


def make_cgroup():
    """A new, empty cgroup v2 for one job below the runner's own, or None
    where that is not ours to make (read-only or foreign hierarchy, cgroup v1
    only, a kernel without cgroup.kill)."""
    base = _own_cgroup()
    if base is None or not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
        return None
    path = os.path.join(base, "dlock-job-%d" % os.getpid())
    try:
        os.mkdir(path)
    except OSError:
        return None
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        remove_cgroup(path)
        return None
    return path


def kill_cgroup(path):
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as handle:
            handle.write("1")
    except (IOError, OSError):
        pass


def remove_cgroup(path):
    """rmdir once empty: True when it is gone."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _in_cgroup(pid, path):
    try:
        with open("/proc/%d/cgroup" % pid) as handle:
            return any(line.startswith("0::") and path.endswith(line[3:].rstrip("\n")) for line in handle)
    except (IOError, OSError):
        return False


# -- the guard (runs in the forked child, never returns) ----------------------------
def _descendants(root):
    """pids of every process below root (from /proc), zombies included."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (IOError, OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _reap(job_pid):
    """Reap exited children. (has children left, the job's wait status or None)."""
    status = None
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False, status
        if pid == 0:
            return True, status
        if pid == job_pid:
            status = raw


def _kill_tree(job_pid, cgroup, wake_r, status):
    """SIGKILL everything below the guard until nothing is left. A subreaper
    with no child has no descendant at all (orphans come to it), so the
    common case costs one waitpid, no /proc scan. (job status, processes killed)."""
    killed = set()
    deadline = now() + KILL_SECONDS
    while True:
        left, job_status = _reap(job_pid)
        status = job_status if job_status is not None else status
        if not left or now() > deadline:
            break
        if cgroup and not killed:
            kill_cgroup(cgroup)  # first, atomically; the walk below catches what left the cgroup
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        select.select([wake_r], [], [], 0.01)  # SIGCHLD wakes it
        drain(wake_r)
    killed.discard(job_pid)
    return status, len(killed)


def drain(fd):
    """Read a non-blocking wake-up pipe empty, so that it wakes no one again."""
    try:
        while os.read(fd, 512):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _send(fd, text):
    try:
        os.write(fd, (text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass  # the runner is gone


def _send_fds(sock_fd, fds):
    """Pass fds to the process at the other end of the unix socket sock_fd,
    with one byte of data (SCM_RIGHTS: it gets its own descriptors of the
    same open files). OSError when that process is gone."""
    sock = _socket.socket(fileno=sock_fd)
    try:
        sock.sendmsg([b"f"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                               b"".join(fd.to_bytes(_INT_BYTES, sys.byteorder) for fd in fds))],
                     _socket.MSG_NOSIGNAL)
    finally:
        sock.detach()  # the descriptor stays the caller's


def _receive(sock_fd, kept):
    """Read one message of the runner from the life socket; the descriptors it
    carried are added to `kept`. False at end of file: the runner is gone, or
    it ended the run."""
    sock = _socket.socket(fileno=sock_fd)
    try:
        data, ancillary, _flags, _address = sock.recvmsg(
            1, _socket.CMSG_SPACE(MAX_GUARD_FDS * _INT_BYTES), _socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.detach()
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % _INT_BYTES
            kept.extend(int.from_bytes(payload[at:at + _INT_BYTES], sys.byteorder)
                        for at in range(0, usable, _INT_BYTES))
    return bool(data)


def _close_all(fds):
    while fds:
        os.close(fds.pop())


def _close_inherited(keep):
    """Drop the runner's descriptors (backend sockets, a flock'd file): the
    guard never uses them and must not keep a connection or lock alive."""
    for fd in sorted(set(int(name) for name in os.listdir("/proc/self/fd")) - set(keep) - {0, 1, 2}):
        try:
            os.close(fd)
        except OSError:
            pass  # the directory's own descriptor, already closed


def _encode(argv, env, cwd):
    """The command for the job's process: cwd, len(argv), argv, NAME=VALUE...,
    NUL-separated; what subprocess.Popen refuses is refused (ValueError)."""
    words = [os.fsencode(cwd or ""), str(len(argv)).encode()]
    for arg in argv:
        words.append(os.fsencode(arg))
    for name, value in env.items():
        name, value = os.fsencode(name), os.fsencode(value)
        if not name or b"=" in name:
            raise ValueError("illegal environment variable name")
        words.append(name + b"=" + value)
    if any(b"\0" in word for word in words):
        raise ValueError("embedded null byte")
    return b"\0".join(words)


def _decode(data):
    words = data.split(b"\0")
    count = int(words[1])
    argv = words[2:2 + count]
    env = dict(word.split(b"=", 1) for word in words[2 + count:])
    return argv, env, words[0] or None


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _job_process(guard_pid, cgroup, prctl, spec_r, err_w):
    """The job's process until it execs the command: in a process group of its
    own, killed when the guard dies, in the job's cgroup; then it waits for
    the command (end of file without one: no job, it exits). A failed exec
    or chdir is written to err_w ("error ERRNO TEXT"); a successful exec
    closes it (close-on-exec) unwritten. Never returns."""
    try:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != guard_pid:  # the guard died before prctl took effect
                os._exit(1)
        if cgroup:
            try:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as handle:
                    handle.write("0")  # the slow step (an RCU grace period), done while the runner works
            except (IOError, OSError):
                pass  # the guard sees it (_in_cgroup) and the run is guarded only
        data = _read_all(spec_r)
        if not data:
            _send(err_w, "dismissed")
            os._exit(0)
        argv, env, cwd = _decode(data)
        # As subprocess does (restore_signals): what Python ignores, the job must not.
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        if cwd:
            os.chdir(cwd)
        _execvpe(argv, env)
    except OSError as exc:
        _send(err_w, "error %d %s" % (exc.errno or 0, exc.strerror or exc))
    except BaseException:  # nothing may escape a forked child: it ends here
        pass
    os._exit(127)


def _execvpe(argv, env):
    """os.execvpe, less its import of warnings (os.get_exec_path imports it
    on every call: 1.2 ms of the job's start, after the grant): the same
    search of the job's PATH (os.defpath without one), the same error
    raised (the first other than "not there", else the last). argv and env
    are bytes, as _decode gives them."""
    name = argv[0]
    if b"/" in name:
        os.execve(name, argv, env)
    first = last = None
    for directory in env.get(b"PATH", os.defpath.encode()).split(b":"):
        try:
            os.execve(os.path.join(directory, name), argv, env)
        except OSError as exc:
            last = exc
            if first is None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                first = exc
    raise first or last


def _await_exec(err_r, life_r, kept):
    """Wait until the job's process execs the command: "started", or the
    line it wrote (its exec failed, or it was dismissed), or None when the
    runner ended (or dismissed the job) first. Descriptors the runner passes
    meanwhile go to `kept`. The wake-up pipe is left alone: a job that ends
    at once has its SIGCHLD there for the main loop."""
    while True:
        readable = select.select([err_r, life_r], [], [])[0]
        if err_r in readable:
            said = _read_all(err_r).decode("utf-8", "replace").strip()
            return said or "started"
        if life_r in readable and not _receive(life_r, kept):
            return None


def _guard(cgroup, spec_r, life_r, report_w):
    """Fork the job's process, wait for its exec, then for the job or for the
    runner's end; kill what is left, let go of the descriptors the runner
    passed (a lock), report "exit STATUS KILLED". Never returns: os._exit,
    so nothing of the runner's state (buffers, atexit) runs twice."""
    kept = []  # descriptors from the runner: closed only once nothing of the job is left
    try:
        prctl, wake_r, err_r, err_w = _become_guard(spec_r, life_r, report_w)
        guard_pid = os.getpid()
        job_pid = os.fork()
        if job_pid == 0:
            os.close(err_r)
            os.close(life_r)
            os.close(report_w)
            _job_process(guard_pid, cgroup, prctl, spec_r, err_w)
        os.close(spec_r)
        os.close(err_w)
        said = _await_exec(err_r, life_r, kept)
        if said != "started":
            _not_started(job_pid, said, kept, cgroup, report_w)
        contained = "cgroup" if cgroup and _in_cgroup(job_pid, cgroup) else "guard"
        _send(report_w, "started %d %s" % (job_pid, contained))
        status = _await_job(job_pid, life_r, wake_r, kept)
        status, killed = _kill_tree(job_pid, cgroup, wake_r, status)
        # Nothing of the job is left: the lock may go now. Before the report,
        # so that the runner's release (after it) is the lock's last holder.
        _let_go(kept, cgroup)
        _send(report_w, "exit %d %d" % (-1 if status is None else status, killed))
    except BaseException:  # the job dies with us (its PDEATHSIG); the runner kills the rest
        os._exit(1)
    os._exit(0)


def _become_guard(spec_r, life_r, report_w):
    """The guard's own session, its subreaper role, its pipes and its signal
    handlers; (prctl, wake_r, err_r, err_w)."""
    os.setsid()
    prctl = _prctl()  # ctypes is imported here: forked before the runner has threads, while it works
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    err_r, err_w = os.pipe()  # close-on-exec: the job's exec closes it
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    _close_inherited((spec_r, life_r, report_w, wake_r, wake_w, err_r, err_w))
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _ignore)
    for signum in IGNORED_BY_GUARD:
        signal.signal(signum, _ignore)  # a handler, not SIG_IGN: exec resets it for the job
    return prctl, wake_r, err_r, err_w


def _not_started(job_pid, said, kept, cgroup, report_w):
    """The job did not start (its exec failed, or it was dismissed): nothing
    of it may run. Never returns."""
    os.kill(job_pid, signal.SIGKILL)
    os.waitpid(job_pid, 0)
    _let_go(kept, cgroup)
    if said is not None and said.startswith("error "):
        _send(report_w, said)
    os._exit(0)


def _await_job(job_pid, life_r, wake_r, kept):
    """The job's status once it ended, or None when the runner went away or
    ended the run first (then everything is killed)."""
    status = _reap(job_pid)[1]  # it may have ended already
    while status is None:
        readable = select.select([life_r, wake_r], [], [])[0]
        drain(wake_r)
        status = _reap(job_pid)[1]
        if life_r in readable and not _receive(life_r, kept):
            break  # the runner is gone, or ended the run: kill everything
    return status


def _let_go(kept, cgroup):
    """The runner's descriptors (a lock) closed and the job's cgroup removed:
    nothing of the job is left."""
    _close_all(kept)
    if cgroup:
        remove_cgroup(cgroup)


def _ignore(_signum, _frame):
    pass


# -- the runner's side ------------------------------------------------------------
# Guards that reported and were left to exit on their own (Child.close): a
# zombie each until a later close() of this process, or its exit, reaps it.
_EXITING_GUARDS = []


def reap_exited():
    """Reap the guards of _EXITING_GUARDS that have exited (never waits)."""
    for pid in list(_EXITING_GUARDS):
        try:
            exited = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            exited = True
        if exited:
            _EXITING_GUARDS.remove(pid)


class Child(object):
    """The job as the runner sees it: started under a guard, signalled as a
    process group, waited for through the guard.

    Child(argv, env, cwd) starts a job at once; Child.prepare() starts the
    guard and the job's process without a command, for start() to give it
    one later or dismiss() to end them."""

    def __init__(self, argv, env, cwd=None, cgroup=True):
        self._prepare(cgroup)
        self.start(argv, env, cwd)

    @classmethod
    def prepare(cls, cgroup=True):
        """cgroup: make the job a cgroup of its own where one can be made
        (False: DLOCK_CGROUP=off, the guard alone)."""
        child = cls.__new__(cls)
        child._prepare(cgroup)
        return child

    def _prepare(self, cgroup):
        self.cgroup = make_cgroup() if cgroup else None
        spec_r, spec_w = os.pipe()
        # A socket, not a pipe: it carries a lock's descriptor to the guard (start).
        life_r, life_w = (end.detach() for end in _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM))
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(spec_w)
            os.close(life_w)
            os.close(report_r)
            _guard(self.cgroup, spec_r, life_r, report_w)
        os.close(spec_r)
        os.close(life_r)
        os.close(report_w)
        # Unbuffered: wait() selects on this descriptor for the guard's last
        # line, which a buffer that had read ahead would hide from it.
        self.pid, self._spec, self._life, self._report = pid, spec_w, life_w, os.fdopen(report_r, "rb", buffering=0)
        self.job_pid = self.containment = self.returncode = None
        self._reaped = False
        self.leftovers = 0
        self.trouble = None

    def start(self, argv, env, cwd=None, guard_fds=()):
        """Run argv (a list; env a dict; cwd or None) in the prepared job's
        process. guard_fds: descriptors the guard keeps until nothing of the
        job is left (Backend.guard_fds), whatever ends the runner. OSError or
        ValueError (as subprocess raises them) when it cannot start; the
        guard is gone then."""
        try:
            spec = _encode(argv, env, cwd)
            if len(guard_fds) > MAX_GUARD_FDS:
                raise ValueError("at most %d descriptors go to the guard" % MAX_GUARD_FDS)
        except ValueError:
            self.dismiss()
            raise
        try:
            if guard_fds:
                # Before the command, and when they cannot be passed (the guard
                # died) no command at all: the job never runs unless the guard
                # holds them.
                _send_fds(self._life, guard_fds)
            while spec:  # the job's process reads as we write (a large environment fills the pipe)
                spec = spec[os.write(self._spec, spec):]
        except OSError:
            pass  # the guard or the job's process died: its report (or none) says so
        os.close(self._spec)
        self._spec = None
        words = self._report.readline().decode("utf-8", "replace").rstrip("\n").split(" ", 2)
        if words[0] != "started":
            self._finish()
            os.waitpid(self.pid, 0)  # it ends at once (_not_started)
            self._reaped = True
            if words[0] == "error":
                raise OSError(int(words[1]), words[2])
            raise OSError(0, "the job's guard died before starting it")
        self.job_pid, self.containment = int(words[1]), words[2]

    def dismiss(self):
        """No job after all (skipped, refused, an error): the job's process
        and the guard end, and the guard removes the cgroup. Not waited for:
        a skipped run ends without waiting for the cgroup move to finish.
        Nothing once the job was started."""
        if self._spec is None:
            return
        os.close(self._spec)
        self._spec = None
        os.close(self._life)
        self._life = None
        self._report.close()
        self._report = None

    def signal_group(self, signum):
        """Signal the job's process group; False when none of it is left."""
        try:
            os.killpg(self.job_pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def kill(self):
        """SIGKILL the job's group now, and have the guard kill all the rest."""
        self.signal_group(signal.SIGKILL)
        if self._life is not None:
            os.close(self._life)
            self._life = None

    def wait(self, timeout, wake_fd=None):
        """The job's return code once the guard has reported it (everything
        of the job is gone then), or None when `timeout` passes or wake_fd
        becomes readable.

        The guard's report is waited for, not its exit: the guard exits just
        after it, and its exit (the unmapping of its copy of the runner, 1-2 ms
        on a busy node) would stand between the job's end and the release,
        where the next holder waits. It is reaped by close(), or later."""
        if self.returncode is not None:
            return self.returncode
        watched = [self._report] + ([wake_fd] if wake_fd is not None else [])
        if self._report not in select.select(watched, [], [], max(0.0, timeout))[0]:
            return None
        words = self._report.readline().decode("utf-8", "replace").split()
        if len(words) == 3 and words[0] == "exit" and words[1] != "-1":
            self.returncode, self.leftovers = _returncode(int(words[1])), int(words[2])
        else:
            # End of file (the guard was killed; its job died with it, PDEATHSIG) or no
            # status (it killed all at our kill()): the rest is ours.
            self.trouble = "the job's guard (pid %d) died; its processes were killed" % self.pid
            self.signal_group(signal.SIGKILL)
            self.returncode = -signal.SIGKILL
            os.waitpid(self.pid, 0)  # it is gone, or ends just after its report
            self._reaped = True
        self._finish()
        return self.returncode

    def _finish(self):
        """After the guard: the cgroup it left (it was killed), and our pipes."""
        if self.cgroup and not remove_cgroup(self.cgroup):  # the guard removes it, unless it was killed
            kill_cgroup(self.cgroup)
            for _attempt in range(100):
                if remove_cgroup(self.cgroup):
                    break
                select.select([], [], [], 0.01)
        if self._life is not None:
            os.close(self._life)
            self._life = None

    def close(self):
        """Our pipes closed, and the guard reaped if it has exited; a guard
        still exiting is reaped by a later close() of this process (reap_exited):
        never waited for here, before the run's release."""
        if self._life is not None:
            os.close(self._life)
            self._life = None
        if self._report is not None:
            self._report.close()
            self._report = None
        if not self._reaped and self._spec is None:  # started, failed or dismissed: the guard ends by itself
            _EXITING_GUARDS.append(self.pid)
            self._reaped = True
        reap_exited()
