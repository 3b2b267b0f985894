"""The dlock lab: a real fleet of systemd-nspawn nodes on one machine.

Every node boots real systemd in its own network namespace, with its own
address on a host bridge and its own sshd, and Ansible reaches it over SSH.
Both a CLI (``python3 tests/lab/lab.py --help``) and a module::

    from lab import Lab
    lab = Lab()                      # prefix from DLOCK_LAB_PREFIX, else "dlk"
    lab.up(nodes=3, backend=True)    # or backends=3: PREFIX-b1..b3
    lab.ssh("n1", "systemctl is-system-running").stdout
    lab.crash("n2"); lab.start("n2")
    lab.down()

Everything the lab creates is named after one prefix (netns and host links
PREFIX-*, nspawn processes with --machine=PREFIX-*, cgroups PREFIX-*, the state
dir /run/PREFIX-lab), so `down` finds and removes all of it by name, even after
this tool crashed. Stdlib only; needs root, debootstrap, systemd-nspawn,
iproute2, and iptables for `delay`.
"""

import argparse
import concurrent.futures
import contextlib
import errno
import fcntl
import glob
import hashlib
import heapq
import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import yaml

DEFAULT_PREFIX = "dlk"
DEFAULT_SUBNET = "10.77.0"  # first three octets of the lab's /24
CACHE_DIR = "/var/cache/dlock-lab"  # image and SSH key, kept between runs
STOP_TIMEOUT = 30  # seconds a clean poweroff may take before the node is killed
BOOT_TIMEOUT = 300  # seconds for `up`/`start` to see every node booted
# Several backend nodes (an etcd cluster) are PREFIX-b1.. at .2..: below the
# one-backend address .10 and the job nodes' .11 and up.
MAX_BACKENDS = 8
# The name a fault test gives the runtime drop-in that keeps a service down
# (e.g. /run/systemd/system/etcd.service.d/faults.conf: Restart=no); one
# left in place is a fault left in place (Lab.faults_left).
FAULT_DROPIN = "faults.conf"

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = "systemd,systemd-sysv,python3,dbus,iproute2,openssh-server,sudo"
# Baked in because nodes have no route to a mirror: what the roles install.
ROLE_PACKAGES = [
    "python3-psycopg", "redis-server", "redis-tools", "postgresql",
    "chrony", "prometheus-node-exporter", "python3-apt", "ca-certificates", "procps",
    "iputils-ping", "etcd-server", "etcd-client",
    "cron",  # not a role's: tests/bench/bench_rollout.py's anchor writes cron entries (ansible.builtin.cron needs crontab)
]
# dlock_postgresql's own settings: the HA mode's packages (Patroni's libraries
# and python3-venv) and the Patroni release it pins, which the image bakes.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                       "roles", "dlock_postgresql", "vars", "main.yml")) as _handle:
    POSTGRESQL_ROLE_VARS = yaml.safe_load(_handle)
ROLE_PACKAGES += [name for name in POSTGRESQL_ROLE_VARS["__dlock_postgresql_ha_packages"]
                  if "{{" not in name and name not in ROLE_PACKAGES]  # postgresql-VERSION is above
# Services the roles enable where needed, and apt timers that could only fail offline.
DISABLED_UNITS = [
    "redis-server.service", "postgresql.service", "chrony.service",
    "prometheus-node-exporter.service", "etcd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "cron.service",
]
IMAGE_REVISION = 1  # bump when the build steps change in a way the lists above do not show


def patroni_pin():
    """(virtual environment, version) of the Patroni dlock_postgresql installs
    from PyPI: baked into the image, as nodes have no route to PyPI, so the
    role's pip task finds it installed."""
    pin = POSTGRESQL_ROLE_VARS["__dlock_postgresql_patroni"]
    return pin["venv"], pin["version"]


APT_SOURCES = f"""\
deb {MIRROR} {SUITE} main
deb {MIRROR} {SUITE}-updates main
deb http://deb.debian.org/debian-security {SUITE}-security main
"""
# Nodes are offline: Ansible's apt module only refreshes lists older than
# cache_valid_time, judged by this stamp, so each boot marks the baked lists fresh.
APT_FRESH_UNIT = """\
[Unit]
Description=dlock lab: mark the baked apt lists fresh (nodes cannot reach a mirror)

[Service]
Type=oneshot
ExecStart=/bin/mkdir -p /var/lib/apt/periodic
ExecStart=/usr/bin/touch /var/lib/apt/periodic/update-success-stamp

[Install]
WantedBy=multi-user.target
"""
SSHD_CONFIG = "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
# No nameserver: lookups fail at once on loopback instead of leaving the node.
RESOLV_CONF = "# dlock lab: no DNS; lab names are in /etc/hosts\n"
SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
]
# One connection per node, shared by every command (ssh's ControlMaster, its
# socket in the lab's state directory): a new login costs about 0.2 s of CPU
# between the host and the node, a command on a shared one a tenth of that,
# and the fault tests read every node's journal every second. Keepalives end
# the shared connection of a node gone silent (crashed, partitioned) after
# about 8 s (the fourth unanswered one); a command waiting on it then falls
# back to a login of its own, bounded by ConnectTimeout: a command to a lost
# node fails within about 13 s (5 s without sharing).
SHARED_CONNECTION = [
    "-o", "ControlMaster=auto", "-o", "ControlPersist=30s",
    "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
]


class LabError(Exception):
    """A lab operation failed; the message says what and why."""


def run(argv, check=True, **kwargs):
    """Run a host command, capturing text output; raise LabError on failure."""
    r = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if check and r.returncode != 0:
        raise LabError(f"{shlex.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def _netem_settings(argv):
    """{ms, loss} of a delay helper from its command line (_netem NODE MS LOSS REPORT)."""
    _node, ms, loss = argv[argv.index("_netem") + 1:][:3]
    return {"ms": float(ms), "loss": float(loss)}


def processes():
    """Yield (pid, argv) of every live process (zombies have no argv)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            if argv:
                yield int(entry), argv


def mountpoints_under(path):
    """Mount points at or below path, deepest first."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point == path or point.startswith(path + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(path):
    """Unmount everything at or below path, so that rmtree never walks into a mount."""
    for point in mountpoints_under(path):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point])
    if mountpoints_under(path):
        raise LabError(f"could not unmount everything under {path}")


def remove_tree(path):
    unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def cgroup_roots():
    """The hierarchies nspawn --keep-unit uses: the named systemd v1 one and cgroup2.

    With no systemd on the host, nspawn --keep-unit puts its supervisor and the
    container in <its own cgroup>/supervisor and /payload. Started from the root
    cgroup, all nodes would share one /payload tree, so one node's systemd would
    see (and stop, and wait for) the others' services. Each node therefore gets
    its own cgroup in every hierarchy nspawn touches.
    """
    roots = []
    with open("/proc/self/mounts") as f:
        for line in f:
            point, fstype, options = line.split()[1:4]
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
                roots.append(point)
    return roots


def cgroup_pids(name):
    pids = set()
    for root in cgroup_roots():
        for dirpath, _dirs, files in os.walk(os.path.join(root, name)):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs")) as f:
                        pids.update(int(p) for p in f.read().split())
                except OSError as exc:
                    # A shutting-down container's systemd just removed it:
                    # gone (ENOENT), or removed between open and read (ENODEV).
                    if exc.errno not in (errno.ENOENT, errno.ENODEV):
                        raise
    return pids


def node_memory_kib(name):
    """The node's resident memory in KiB: the proportional set size (Pss,
    /proc/PID/smaps_rollup) of every process in its cgroup, so pages the
    nodes share (the image's files, mapped by every node) count once across
    the lab. None for a node with no process."""
    total = None
    for pid in cgroup_pids(name):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total = (total or 0) + int(line.split()[1])
                        break
        except (FileNotFoundError, ProcessLookupError):
            pass  # exited meanwhile
    return total


def _process_state(pid):
    """A process's state letter (R, S, T for stopped, ...), None once it exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def kill_cgroup(name):
    """SIGKILL everything in the cgroup: the nspawn process and the whole container.

    Killing only nspawn leaves the booted container running, orphaned.
    """
    deadline = time.monotonic() + 10
    while pids := cgroup_pids(name):
        if time.monotonic() > deadline:
            raise LabError(f"processes {sorted(pids)} of cgroup {name} survive SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def cgroup_cpu_seconds(name):
    """The CPU time all processes of cgroup `name` used (cgroup2's cpu.stat,
    kept until the cgroup is removed), None where there is no cgroup2."""
    for root in cgroup_roots():
        try:
            with open(os.path.join(root, name, "cpu.stat")) as handle:
                for line in handle:
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
        except OSError:
            continue
    return None


def remove_cgroup(name):
    kill_cgroup(name)
    for root in cgroup_roots():
        for dirpath, _dirs, _files in os.walk(os.path.join(root, name), topdown=False):
            try:
                os.rmdir(dirpath)
            except FileNotFoundError:
                pass


def spawn_in_cgroup(name, argv, **popen_kwargs):
    """Start argv inside its own cgroup `name` (created in every hierarchy)."""
    procs_files = []
    for root in cgroup_roots():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        procs_files.append(os.path.join(root, name, "cgroup.procs"))
    # The shell joins the cgroups, then execs argv: no moment runs outside them.
    joins = "".join(f"echo $$ > {shlex.quote(p)} && " for p in procs_files)
    return subprocess.Popen(["sh", "-c", joins + 'exec "$@"', "sh", *argv], **popen_kwargs)


# Every node's systemd (and journald, udev-less as it is) takes inotify
# instances of root's, the host's user: with the suite's labs side by side
# (up to 25 nodes) the kernel's default of 128 ran out, and a node's systemd
# exited at boot ("Failed to create control group inotify object: Too many
# open files"). Raised, never lowered.
INOTIFY_LIMITS = {"/proc/sys/fs/inotify/max_user_instances": 8192,
                  "/proc/sys/fs/inotify/max_user_watches": 1048576}


def raise_inotify_limits():
    for path, wanted in INOTIFY_LIMITS.items():
        with open(path) as handle:
            current = int(handle.read())
        if current < wanted:
            with open(path, "w") as handle:
                handle.write(str(wanted))


def count_for_the_suite(record):
    """Count a lab boot for the suite's budget table (scripts/budget.py's
    append: nothing when DLOCK_SUITE_COUNT is not set)."""
    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    # A test-suite script, found by path (and only when a boot is counted).
    import budget  # pylint: disable=import-outside-toplevel
    budget.append(record)


class Lab:
    """One lab: the nodes, network and state named after one prefix."""

    def __init__(self, prefix=None, subnet=None, cache_dir=CACHE_DIR):
        self.prefix = prefix or os.environ.get("DLOCK_LAB_PREFIX") or DEFAULT_PREFIX
        # Link and netns names are at most 15 characters: PREFIX-backend must fit.
        if not re.fullmatch(r"[a-z][a-z0-9]{0,6}", self.prefix):
            raise LabError(f"prefix {self.prefix!r}: use 1-7 lowercase letters or digits")
        self.subnet = subnet or os.environ.get("DLOCK_LAB_SUBNET") or DEFAULT_SUBNET
        if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", self.subnet):
            raise LabError(f"subnet {self.subnet!r}: give the first three octets, e.g. 10.77.0")
        self.cache_dir = cache_dir
        self.key = os.path.join(cache_dir, "id_ed25519")
        self.image = os.path.join(cache_dir, f"{SUITE}-{self._recipe_hash()}")
        self.state_dir = f"/run/{self.prefix}-lab"
        self.state_file = os.path.join(self.state_dir, "state.json")
        self.inventory = os.path.join(self.state_dir, "inventory.ini")
        self.bridge = f"{self.prefix}-br0"
        self.host_addr = f"{self.subnet}.1"

    # ----------------------------------------------------------------- image

    @staticmethod
    def _recipe_hash():
        """Names the image after its recipe, so a changed recipe builds a new one."""
        recipe = [SUITE, MIRROR, BASE_PACKAGES, ROLE_PACKAGES, patroni_pin(), DISABLED_UNITS, IMAGE_REVISION,
                  APT_SOURCES, APT_FRESH_UNIT, SSHD_CONFIG, RESOLV_CONF]
        return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]

    @staticmethod
    def _image_in_use(image):
        with open("/proc/self/mountinfo") as f:
            return any(f"lowerdir={image}," in line or f"lowerdir={image}:" in line for line in f)

    def build_image(self, force=False):
        """Build the node image unless cached (or force); return its path."""
        os.makedirs(self.cache_dir, exist_ok=True)
        with open(os.path.join(self.cache_dir, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time, whatever the prefix
            if not (os.path.exists(self.key) and os.path.exists(self.key + ".pub")):
                for path in (self.key, self.key + ".pub"):
                    if os.path.exists(path):
                        os.remove(path)
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dlock-lab", "-f", self.key])
                force = True  # a cached image would carry the old public key
            if os.path.isdir(self.image) and not force:
                return self.image
            if self._image_in_use(self.image):
                raise LabError(f"{self.image} is in use by running nodes: `down` them first")
            for stale in glob.glob(os.path.join(self.cache_dir, ".build-*")):
                remove_tree(stale)  # a crashed build; we hold the lock, so none is running
            tmp = os.path.join(self.cache_dir, f".build-{os.getpid()}")
            try:
                self._build_into(tmp)
                if os.path.exists(self.image):
                    os.rename(self.image, tmp + ".old")
                os.rename(tmp, self.image)  # atomic: a half-built image never looks cached
            finally:
                remove_tree(tmp)
                remove_tree(tmp + ".old")
            for old in glob.glob(os.path.join(self.cache_dir, f"{SUITE}-*")):
                if old != self.image and not self._image_in_use(old):
                    remove_tree(old)
        return self.image

    def _build_into(self, root):
        sys.stderr.write(f"lab: building {root} (debootstrap + packages, a few minutes)\n")
        run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, root, MIRROR])

        def write(relpath, text, mode=0o644):
            path = os.path.join(root, relpath)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, mode)

        write("etc/apt/sources.list", APT_SOURCES)
        write("usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)  # start nothing while building
        write("etc/systemd/system/dlock-lab-apt-fresh.service", APT_FRESH_UNIT)
        script = " && ".join([
            "apt-get update -q",
            "apt-get dist-upgrade -y -q",
            "apt-get install -y -q --no-install-recommends " + " ".join(ROLE_PACKAGES),
            "apt-get clean",  # keeps the lists: offline installs of baked packages still resolve
            # As dlock_postgresql's pip task makes it, from the wheel fetched below.
            "python3 -m venv --system-site-packages {0} && {0}/bin/pip install -q --no-deps --no-index "
            "/var/cache/patroni-wheel/patroni-{1}-py3-none-any.whl && rm -r /var/cache/patroni-wheel".format(*patroni_pin()),
            "systemctl disable " + " ".join(DISABLED_UNITS),
            "systemctl enable dlock-lab-apt-fresh.service",
        ])
        # Patroni's wheel comes through the host's pip (its index, proxy and CA
        # settings), then is installed offline in the image.
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
             "-d", os.path.join(root, "var", "cache", "patroni-wheel"), "patroni==%s" % patroni_pin()[1]])
        # nspawn rather than chroot: it mounts /proc, /sys, /dev for the maintainer
        # scripts and unmounts them whatever happens. Host network for the mirror.
        # Named without a dash, so no lab's `down` (which matches PREFIX-*) takes it for a node.
        build = spawn_in_cgroup("dlocklabbuild", [
            "systemd-nspawn", "-q", "-D", root, "--register=no", "--keep-unit",
            "--machine=dlocklabbuild", "--resolv-conf=bind-host", "--link-journal=no",
            "--setenv=DEBIAN_FRONTEND=noninteractive", "sh", "-c", script,
        ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = build.communicate()[0]
        remove_cgroup("dlocklabbuild")
        shutil.rmtree("/run/systemd/nspawn/propagate/dlocklabbuild", ignore_errors=True)
        if build.returncode != 0:
            raise LabError(f"package install in the image failed:\n{output[-4000:]}")

        os.remove(os.path.join(root, "usr/sbin/policy-rc.d"))  # roles may start services
        os.remove(os.path.join(root, "etc/hostname"))  # each node takes its machine name
        write("etc/machine-id", "")  # each node gets its own (written at node creation)
        dbus_id = os.path.join(root, "var/lib/dbus/machine-id")
        if os.path.lexists(dbus_id):
            os.remove(dbus_id)  # systemd would copy it back into /etc/machine-id
        write("etc/resolv.conf", RESOLV_CONF)
        write("etc/ssh/sshd_config.d/dlock-lab.conf", SSHD_CONFIG)
        os.makedirs(os.path.join(root, "root/.ssh"), mode=0o700, exist_ok=True)
        shutil.copyfile(self.key + ".pub", os.path.join(root, "root/.ssh/authorized_keys"))
        os.chmod(os.path.join(root, "root/.ssh/authorized_keys"), 0o600)
        run(["ssh-keygen", "-A", "-f", root])  # host keys, shared by all nodes of the lab

    # ----------------------------------------------------------------- naming

    def _node_list(self, nodes, backends):
        """Backend nodes first: one is PREFIX-backend at .10 (as ever), several
        are PREFIX-b1.. at .2..; then the job nodes PREFIX-n1.. at .11.."""
        if backends == 1:
            wanted = [{"name": f"{self.prefix}-backend", "group": "dlock_backend", "addr": f"{self.subnet}.10"}]
        else:
            wanted = [{"name": f"{self.prefix}-b{i}", "group": "dlock_backend", "addr": f"{self.subnet}.{1 + i}"}
                      for i in range(1, backends + 1)]
        wanted += [{"name": f"{self.prefix}-n{i}", "group": "dlock_nodes", "addr": f"{self.subnet}.{10 + i}"}
                   for i in range(1, nodes + 1)]
        return wanted

    def _load_state(self):
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except FileNotFoundError:
            return {"prefix": self.prefix, "subnet": self.subnet, "nodes": []}

    def _save_state(self, state):
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self.state_file + ".tmp", "w") as f:
            json.dump(state, f, indent=2)
        os.replace(self.state_file + ".tmp", self.state_file)

    @property
    def nodes(self):
        """Names of the lab's nodes (backend first, if any)."""
        return [n["name"] for n in self._load_state()["nodes"]]

    def group(self, group):
        """Names of the nodes in an inventory group (dlock_nodes or dlock_backend)."""
        return [n["name"] for n in self._load_state()["nodes"] if n["group"] == group]

    def node(self, node):
        """Full name of a node given as 'dlk-n1' or 'n1'."""
        names = self.nodes
        for candidate in (node, f"{self.prefix}-{node}"):
            if candidate in names:
                return candidate
        raise LabError(f"no node {node!r} in lab {self.prefix} (nodes: {', '.join(names) or 'none'})")

    def addr(self, node):
        name = self.node(node)
        return next(n["addr"] for n in self._load_state()["nodes"] if n["name"] == name)

    def _node_dir(self, name):
        return os.path.join(self.state_dir, "nodes", name)

    def _log(self, name):
        return os.path.join(self.state_dir, f"{name}.log")

    def pid(self, node):
        """Pid of the node's systemd-nspawn process, or None when the node is down."""
        flag = f"--machine={self.node(node)}"
        return next((pid for pid, argv in processes() if flag in argv), None)

    def _discovered(self):
        """Node names found on the system by prefix, whatever the state file says."""
        names = set(self.nodes)
        mark = f"--machine={self.prefix}-"
        names.update(a[len("--machine="):] for _pid, argv in processes() for a in argv if a.startswith(mark))
        names.update(self._netns_names())
        for root in cgroup_roots():
            names.update(os.path.basename(p) for p in glob.glob(os.path.join(root, f"{self.prefix}-*")))
        names.update(os.path.basename(p) for p in glob.glob(os.path.join(self.state_dir, "nodes", "*")))
        return sorted(names)

    def _netns_names(self):
        out = run(["ip", "-j", "netns", "list"]).stdout.strip()
        return [n["name"] for n in json.loads(out or "[]") if n["name"].startswith(self.prefix + "-")]

    def _link_names(self):
        return [link["ifname"] for link in json.loads(run(["ip", "-j", "link", "show"]).stdout)
                if link["ifname"].startswith(self.prefix + "-")]

    # ----------------------------------------------------------------- up

    def up(self, nodes=3, backend=False, timeout=BOOT_TIMEOUT, backends=None):
        """Make the lab run exactly these nodes, all booted; return their names.

        backends is the number of backend nodes (group dlock_backend); when it
        is not given, backend=True means one. Converges from any state: creates
        what is missing, boots nodes that are down, removes nodes beyond the
        requested set, leaves running ones alone.
        """
        if os.geteuid() != 0:
            raise LabError("the lab needs root")
        if not 1 <= nodes <= 244:
            raise LabError("--nodes must be between 1 and 244")
        if backends is None:
            backends = 1 if backend else 0
        if not 0 <= backends <= MAX_BACKENDS:
            raise LabError(f"--backends must be between 0 and {MAX_BACKENDS}")
        with open("/proc/sys/net/ipv4/ip_forward") as f:
            if f.read().strip() != "0":
                # Nodes route via the host: forwarding would let their traffic leave the machine.
                raise LabError("net.ipv4.ip_forward is on; the lab needs it off so nodes stay isolated")
        raise_inotify_limits()
        state = self._load_state()
        new_lab = not state["nodes"]
        if state["nodes"] and state["subnet"] != self.subnet:
            raise LabError(f"lab {self.prefix} runs on {state['subnet']}.0/24: `down` it first")
        image = self.build_image()
        wanted = self._node_list(nodes, backends)
        wanted_names = {n["name"] for n in wanted}
        for name in self._discovered():
            if name not in wanted_names:
                self._remove_node(name)
        self._ensure_bridge()
        state = {"prefix": self.prefix, "subnet": self.subnet, "image": image, "nodes": wanted}
        self._save_state(state)
        for node in wanted:
            self._ensure_node(node, image)
        self._write_hosts(wanted)
        to_boot = [n["name"] for n in wanted if self.pid(n["name"]) is None]
        spawned = dict((name, self._boot(name)) for name in to_boot)
        self._wait_booted(to_boot, timeout, spawned)
        self._write_inventory(wanted)
        if to_boot:
            count_for_the_suite({"event": "up", "lab": self.prefix, "new_lab": new_lab, "booted": len(to_boot)})
        return [n["name"] for n in wanted]

    def _ensure_bridge(self):
        owner = json.loads(run(["ip", "-j", "addr", "show", "to", f"{self.host_addr}/32"]).stdout)
        if owner and owner[0]["ifname"] != self.bridge:
            raise LabError(f"{self.host_addr} is already on {owner[0]['ifname']}: pick another --subnet")
        if not os.path.exists(f"/sys/class/net/{self.bridge}"):
            run(["ip", "link", "add", self.bridge, "type", "bridge"])
        if not owner:
            run(["ip", "addr", "add", f"{self.host_addr}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])

    def _ensure_node(self, node, image):
        """Network namespace, veth into the bridge, and a persistent overlay root."""
        name, addr = node["name"], node["addr"]
        if not os.path.exists(f"/run/netns/{name}"):
            run(["ip", "netns", "add", name])
        if not os.path.exists(f"/sys/class/net/{name}"):
            # The host end carries the node's name; the node end is born inside as eth0.
            run(["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name])
            inside = ["ip", "-n", name]
            run(inside + ["link", "set", "lo", "up"])
            run(inside + ["addr", "add", f"{addr}/24", "dev", "eth0"])
            run(inside + ["link", "set", "eth0", "up"])
            run(inside + ["route", "add", "default", "via", self.host_addr])
        run(["ip", "link", "set", name, "master", self.bridge, "up"])
        # A persistent overlay instead of --volatile=overlay: a node that is stopped
        # or crashed comes back with what the roles installed, like a real machine.
        d = self._node_dir(name)
        root = os.path.join(d, "root")
        if not os.path.ismount(root):
            for sub in ("upper", "work", "root"):
                os.makedirs(os.path.join(d, sub), exist_ok=True)
            run(["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={image},upperdir={d}/upper,workdir={d}/work", root])
        machine_id = os.path.join(root, "etc/machine-id")
        if os.path.getsize(machine_id) == 0:
            with open(machine_id, "w") as f:
                f.write(uuid.uuid4().hex + "\n")

    def _write_hosts(self, nodes):
        """Every node resolves every lab name (written through the overlays, even while running)."""
        text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        text += f"{self.host_addr} {self.prefix}-host\n"
        text += "".join(f"{n['addr']} {n['name']}\n" for n in nodes)
        for n in nodes:
            path = os.path.join(self._node_dir(n["name"]), "root/etc/hosts")
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)

    def _boot(self, name):
        """Start the node; returns the Popen of its nspawn (the shell that execs it)."""
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self._log(name), "ab") as log:
            return spawn_in_cgroup(name, [
                "systemd-nspawn", "-q", "-D", os.path.join(self._node_dir(name), "root"),
                # No host systemd and no bus: nspawn must not register or make a scope.
                "--register=no", "--keep-unit", f"--machine={name}",
                f"--network-namespace-path=/run/netns/{name}",
                "--resolv-conf=off", "--link-journal=no", "-b",
            ], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_booted(self, names, timeout, spawned=None):
        """Wait (in parallel) until each node's systemd finished booting and sshd answers.

        spawned: {name: Popen} of the nodes just booted. Their own process says
        whether nspawn exited: a scan of /proc can miss it while the shell execs
        nspawn (its cmdline reads empty for that moment), which once failed a
        healthy boot."""
        deadline = time.monotonic() + timeout
        spawned = spawned or {}

        def exited(name):
            proc = spawned.get(name)
            return proc.poll() is not None if proc is not None else self.pid(name) is None

        def wait_one(name):
            while True:
                if exited(name):
                    raise LabError(f"{name}: systemd-nspawn exited while booting; log {self._log(name)}:\n"
                                   + self._log_tail(name))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LabError(f"{name}: not booted after {timeout}s; log {self._log(name)}")
                try:
                    r = self.ssh(name, "systemctl is-system-running --wait", timeout=left)
                except subprocess.TimeoutExpired:
                    continue
                if r.stdout.strip() in ("running", "degraded"):
                    return
                if r.returncode != 255:  # --wait only returns once booting is over
                    raise LabError(f"{name}: boot ended {r.stdout.strip() or r.stderr.strip()!r}; "
                                   f"log {self._log(name)}")
                time.sleep(0.3)  # sshd not up yet

        if names:
            with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
                for future in [pool.submit(wait_one, n) for n in names]:
                    future.result()

    def _log_tail(self, name):
        with open(self._log(name), errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def _write_inventory(self, nodes):
        lines = []
        for group in ("dlock_nodes", "dlock_backend"):
            lines.append(f"[{group}]")
            lines += [f"{n['name']} ansible_host={n['addr']}" for n in nodes if n["group"] == group]
            lines.append("")
        lines += [
            "[all:vars]",
            "ansible_user=root",
            f"ansible_ssh_private_key_file={self.key}",
            "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'",
            "ansible_python_interpreter=/usr/bin/python3",
            "",
        ]
        with open(self.inventory, "w") as f:
            f.write("\n".join(lines))

    # ----------------------------------------------------------------- down

    def down(self, timeout=STOP_TIMEOUT):
        """Power every node off (killing what does not stop in time) and remove all
        the lab's namespaces, links, cgroups, mounts and state. A no-op when nothing is there."""
        names = self._discovered()
        self._close_shared_connections()
        self._stop(names, timeout)
        for name in names:
            self._remove_node(name)
        for ns in self._netns_names():  # anything not found as a node above
            self._remove_netns(ns)
        for link in self._link_names():
            run(["ip", "link", "del", link], check=False)
        remove_tree(self.state_dir)
        if left := self.leftovers():
            raise LabError("down left behind: " + ", ".join(left))

    def leftovers(self):
        """Whatever of this prefix exists on the system (empty after `down`)."""
        mark = f"--machine={self.prefix}-"
        return ([f"netns {n}" for n in self._netns_names()]
                + [f"link {n}" for n in self._link_names()]
                + [f"process {pid}" for pid, argv in processes() if any(a.startswith(mark) for a in argv)]
                + [f"cgroup {p}" for root in cgroup_roots() for p in glob.glob(os.path.join(root, f"{self.prefix}-*"))]
                + [f"mount {p}" for p in mountpoints_under(self.state_dir)]
                + ([f"dir {self.state_dir}"] if os.path.exists(self.state_dir) else []))

    def _remove_node(self, name):
        self._stop([name], STOP_TIMEOUT)
        # What the node cost, for the suite's budget table (its cgroup is
        # not its stage's: that one counts the stage's processes on the host).
        seconds = cgroup_cpu_seconds(name)
        if seconds is not None and os.environ.get("DLOCK_SUITE_COUNT"):
            count_for_the_suite({"event": "node_cpu", "node": name, "seconds": round(seconds, 1)})
        remove_cgroup(name)
        self._remove_netns(name)  # also removes the veth pair
        remove_tree(self._node_dir(name))
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{name}", ignore_errors=True)  # nspawn leftover
        if os.path.exists(self._log(name)):
            os.remove(self._log(name))

    def _remove_netns(self, name):
        if not os.path.exists(f"/run/netns/{name}"):
            return
        for pid in run(["ip", "netns", "pids", name]).stdout.split():  # e.g. a delay helper
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        run(["ip", "netns", "delete", name])

    def _stop(self, names, timeout):
        """SIGTERM makes nspawn power its container off; whatever is left after timeout is killed.

        A container whose nspawn is gone (killed alone) cannot be powered off: it is killed at once.
        """
        signalled = []
        for name in names:
            pid = next((p for p, argv in processes() if f"--machine={name}" in argv), None)
            if pid:
                os.kill(pid, signal.SIGTERM)
                signalled.append(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(cgroup_pids(n) for n in signalled):
            time.sleep(0.1)
        for name in names:
            kill_cgroup(name)

    # ----------------------------------------------------------------- faults

    def stop(self, node, timeout=STOP_TIMEOUT):
        """Clean poweroff (SIGKILL after timeout). The node's disk state is kept."""
        self._stop([self.node(node)], timeout)

    def crash(self, node):
        """Power cut: SIGKILL nspawn and every process of the container at once."""
        kill_cgroup(self.node(node))

    def start(self, node, wait=True, timeout=BOOT_TIMEOUT):
        """Boot a stopped or crashed node again (no-op if it runs); unless wait is
        false (e.g. to boot it while partitioned), wait until it booted and sshd answers."""
        name = self.node(node)
        spawned = {}
        if self.pid(name) is None:
            kill_cgroup(name)  # nothing of the previous boot may linger
            spawned[name] = self._boot(name)
        if wait:
            self._wait_booted([name], timeout, spawned)

    def partition(self, node):
        """Cut the node off the network (host end of its veth down)."""
        run(["ip", "link", "set", self.node(node), "down"])

    def heal(self, node):
        run(["ip", "link", "set", self.node(node), "up"])

    def delay(self, node, ms, loss=0.0):
        """Delay every packet sent to the node by ms (so each round trip with it
        gets ms longer) and drop loss percent of them.

        This machine's kernel has no sch_netem, so tc netem is out: an iptables
        NFQUEUE rule in the node's namespace hands incoming packets to a helper
        (this file's `_netem` command) that holds them, then lets them through.
        The helper runs in the real-time class and reports how punctual it was
        (delay_report): a test checks that the delay it asked for is the one
        the node got.
        """
        name = self.node(node)
        if not shutil.which("iptables"):
            raise LabError("delay needs iptables on the host: apt-get install iptables")
        self.undelay(name)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._netem_report(name))  # a report of this delay's own, not of the last one
        with open(self._log(name), "ab") as log:
            helper = subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, os.path.abspath(__file__),
                 "--prefix", self.prefix, "_netem", name, str(ms), str(loss), self._netem_report(name)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        ready = select.select([helper.stdout], [], [], 10)[0] and helper.stdout.readline()
        helper.stdout.close()
        if ready != b"ready\n":
            helper.kill()
            raise LabError(f"{name}: the delay helper did not start; see {self._log(name)}")
        # --queue-bypass: if the helper dies, packets flow again instead of vanishing.
        run(["ip", "netns", "exec", name, "iptables", "-w", "-I", "INPUT", "-i", "eth0",
             "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"])

    def undelay(self, node):
        name = self.node(node)
        rule = ["INPUT", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"]
        while run(["ip", "netns", "exec", name, "iptables", "-w", "-C", *rule], check=False).returncode == 0:
            run(["ip", "netns", "exec", name, "iptables", "-w", "-D", *rule])
        for pid, _argv in self._netem_helpers(name):
            os.kill(pid, signal.SIGKILL)

    def _netem_report(self, name):
        return os.path.join(self.state_dir, f"netem-{name}.json")

    def delay_report(self, node):
        """What the delay helper of the node measured of itself (netem's
        REPORT): {delay_ms, packets, late_max_ms, late_p99_ms}; None before
        it held any packet."""
        try:
            with open(self._netem_report(self.node(node))) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None

    def _netem_helpers(self, name):
        return [(pid, argv) for pid, argv in processes()
                if "_netem" in argv and argv[argv.index("_netem") + 1:][:1] == [name]]

    def pause(self, node, pattern):
        """SIGSTOP the node's processes whose command line matches the regex; return their host pids."""
        return self._signal_matching(node, pattern, signal.SIGSTOP)

    def resume(self, node, pattern):
        return self._signal_matching(node, pattern, signal.SIGCONT)

    def _signal_matching(self, node, pattern, sig):
        name = self.node(node)
        nspawn = self.pid(name)
        regex = re.compile(pattern)
        matched = []
        for pid in sorted(cgroup_pids(name) - {nspawn}):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                if regex.search(cmdline):
                    os.kill(pid, sig)
                    matched.append(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass  # exited meanwhile
        if not matched:
            raise LabError(f"{name}: no process matches {pattern!r}")
        return matched

    def faults_left(self):
        """What a test left of its faults, as [(node, what)]: a node not
        running, cut off (its link down), delayed, unreachable over SSH, with
        stopped (SIGSTOP) processes or a fault test's runtime drop-in
        (FAULT_DROPIN). Empty when every node is whole: the lab fixtures
        check it after each test module (tests/lab/conftest.py)."""
        def node_faults(entry):
            name, found = entry["name"], []
            if not entry["running"]:
                return [(name, "not running")]
            if entry["link"] != "up":
                found.append((name, "link " + entry["link"]))
            if entry["delay"]:
                found.append((name, "delayed: %r" % entry["delay"]))
            stopped = sorted(pid for pid in cgroup_pids(name) if _process_state(pid) == "T")
            if stopped:
                found.append((name, "stopped processes: %s" % stopped))
            if entry["link"] != "up":
                return found
            # One login per node, its reachability and its drop-ins at once; a
            # minute, not status()'s 10 s: a login can be slow on a busy lab host.
            dropins = self.ssh(name, "find /run/systemd/system -name %s" % FAULT_DROPIN, timeout=60)
            if dropins.returncode == 255:
                found.append((name, "unreachable over SSH: %s" % dropins.stderr.strip()))
            elif dropins.stdout.split():
                found.append((name, "fault drop-ins: %s" % " ".join(dropins.stdout.split())))
            return found

        entries = self.status(logins=False)
        with concurrent.futures.ThreadPoolExecutor(max(1, len(entries))) as pool:
            return [fault for faults in pool.map(node_faults, entries) for fault in faults]

    # ----------------------------------------------------------------- access

    def ssh_argv(self, node, shared=True):
        """The ssh command line that logs into the node as root (append a
        command); with SHARED, on the node's shared connection while the lab
        is up. The shared connection makes the descriptors it is handed
        non-blocking and leaves them so: a caller gives it descriptors of
        its own (lab.ssh: pipes, or a /dev/null of its own), never one it
        shares with other programs (a terminal, its own stdin)."""
        options = []
        if shared and os.path.isdir(self.state_dir):
            options = [*SHARED_CONNECTION, "-o", f"ControlPath={self.state_dir}/ssh-%C"]
        return ["ssh", "-i", self.key, *SSH_OPTIONS, *options, f"root@{self.addr(node)}"]

    def shared_connections(self):
        """The pids of the ssh masters whose sockets are in the state
        directory: the nodes' shared connections, and the verify sets'
        testinfra ones."""
        mark = self.state_dir + "/"
        # A master's title is "ssh: SOCKET [mux]" once it went to the background.
        return {pid for pid, argv in processes()
                if os.path.basename((argv[0].split() or [""])[0]).rstrip(":") == "ssh"
                and any(mark in arg for arg in argv)}

    def _close_shared_connections(self):
        """End the shared connections: a master outlives its last command by
        its ControlPersist."""
        for pid in self.shared_connections():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def ssh(self, node, command, timeout=120, check=False, input=None):
        """Run a command (a shell string, or an argv list) on the node over SSH.

        Returns subprocess.CompletedProcess (returncode, stdout, stderr as text);
        returncode 255 means SSH itself failed. Raises LabError if check and the
        command failed, subprocess.TimeoutExpired after timeout seconds.
        """
        if not isinstance(command, str):
            command = shlex.join(command)
        # No input: a /dev/null of the command's own, not this process's stdin
        # (ssh_argv says why).
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        r = subprocess.run(self.ssh_argv(node) + [command], capture_output=True, text=True, timeout=timeout,
                           check=False, **stdin)
        if check and r.returncode != 0:
            raise LabError(f"{node}: {command!r} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def status(self, logins=True):
        """One dict per node: name, group, addr, pid, running, link, delay,
        memory_kib (node_memory_kib), and (with logins: one SSH login per
        node) system, systemd's state."""
        state = self._load_state()
        links = {link["ifname"]: link for link in json.loads(run(["ip", "-j", "link", "show"]).stdout)}
        result = []
        for n in state["nodes"]:
            name = n["name"]
            pid = self.pid(name)
            link = links.get(name)
            helpers = self._netem_helpers(name)
            result.append({
                **n, "pid": pid, "running": pid is not None,
                "link": "missing" if link is None else ("up" if "UP" in link["flags"] else "down"),
                "delay": None if not helpers else _netem_settings(helpers[0][1]),
                "memory_kib": node_memory_kib(name) if pid is not None else None,
            })

        def system_state(entry):
            if not entry["running"] or entry["link"] != "up":
                return "-"
            try:
                r = self.ssh(entry["name"], "systemctl is-system-running", timeout=10)
            except subprocess.TimeoutExpired:
                return "unreachable"
            return r.stdout.strip() if r.returncode != 255 else "unreachable"

        if logins:
            with concurrent.futures.ThreadPoolExecutor(max(1, len(result))) as pool:
                for entry, system in zip(result, pool.map(system_state, result)):
                    entry["system"] = system
        return result


# --------------------------------------------------------------------- netem helper

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_COPY_META, NFQA_CFG_F_FAIL_OPEN = 1, 1, 1
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR = 1, 4, 2


def netem(delay_ms, loss_pct, report, queue=0):
    """Serve NFQUEUE `queue` in the current network namespace: drop loss_pct % of
    the packets, release the others delay_ms after they arrived. Runs until killed.

    A helper in user space is only as punctual as the CPU lets it be: on a
    loaded machine a helper at normal priority held packets for seconds, not
    for delay_ms. So it runs SCHED_FIFO (the kernel's real-time class, which
    ordinary processes cannot preempt; the kernel still keeps 5% of each
    second for them), and it measures itself: the file REPORT (JSON, rewritten
    every second while packets flow) holds how many packets it held and how
    late past their due time it let them go, for a test to check the delay
    it asked for is the delay it got (Lab.delay_report)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except OSError as exc:
        sys.stderr.write(f"netem: stays at normal priority ({exc}): its delays may run late on a busy machine\n")
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((0, 0))

    def message(msg_type, attrs, flags):
        body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue)  # nfgenmsg
        for attr_type, data in attrs:
            attr = struct.pack("=HH", 4 + len(data), attr_type) + data
            body += attr + b"\0" * (-len(attr) % 4)
        return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, 0, 0) + body

    config = [
        [(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0))],
        [(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),  # ids only, no payload
         (NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)),
         (NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))],  # queue full: let packets pass
    ]
    for attrs in config:
        sock.send(message(NFQNL_MSG_CONFIG, attrs, NLM_F_REQUEST | NLM_F_ACK))
        reply = sock.recv(65536)
        if struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR and struct.unpack_from("=i", reply, 16)[0]:
            raise OSError(-struct.unpack_from("=i", reply, 16)[0], "NFQUEUE config refused")
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def verdict(packet_id, decision):
        sock.send(message(NFQNL_MSG_VERDICT, [(NFQA_VERDICT_HDR, struct.pack("!II", decision, packet_id))],
                          NLM_F_REQUEST))

    pending = []  # heap of (release time, packet id)
    late = []  # seconds past its due time that each released packet went
    reported = time.monotonic()
    while True:
        if late and time.monotonic() - reported >= 1.0:
            reported = time.monotonic()
            ordered = sorted(late)
            with open(report + ".tmp", "w") as handle:
                json.dump({"delay_ms": delay_ms, "packets": len(ordered), "late_max_ms": 1000 * ordered[-1],
                           "late_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))]}, handle)
            os.replace(report + ".tmp", report)
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else None
        if select.select([sock], [], [], timeout)[0]:
            try:
                data = sock.recv(1 << 16)
            except OSError:  # ENOBUFS: the kernel dropped notifications; carry on
                data = b""
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type = struct.unpack_from("=IH", data, offset)
                if msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    pos = offset + 20  # past nlmsghdr and nfgenmsg
                    while pos + 4 <= offset + length:
                        attr_len, attr_type = struct.unpack_from("=HH", data, pos)
                        if attr_type & 0x3FFF == NFQA_PACKET_HDR:
                            packet_id = struct.unpack_from("!I", data, pos + 4)[0]
                            if random.random() * 100 < loss_pct:
                                verdict(packet_id, NF_DROP)
                            else:
                                heapq.heappush(pending, (time.monotonic() + delay_ms / 1000, packet_id))
                        pos += (attr_len + 3) & ~3
                offset += (length + 3) & ~3
        while pending and pending[0][0] <= time.monotonic():
            due, packet_id = heapq.heappop(pending)
            verdict(packet_id, NF_ACCEPT)
            late.append(time.monotonic() - due)


# --------------------------------------------------------------------- CLI

def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="lab.py",
        description="A fleet of systemd-nspawn nodes on this machine, for dlock.fleet's "
                    "molecule scenarios, demo and fault tests. Needs root.",
        epilog="Nodes are named PREFIX-n1.. (and PREFIX-backend, or PREFIX-b1.. with --backends N); "
               "commands accept the short name (n1, backend, b1) too. The image is cached in " + CACHE_DIR + "; state, "
               "logs and the inventory live in /run/PREFIX-lab/.")
    parser.add_argument("--prefix", default=os.environ.get("DLOCK_LAB_PREFIX", DEFAULT_PREFIX),
                        help="name prefix of everything the lab creates (env DLOCK_LAB_PREFIX; default %(default)s)")
    parser.add_argument("--subnet", default=os.environ.get("DLOCK_LAB_SUBNET", DEFAULT_SUBNET),
                        help="first three octets of the lab /24 (env DLOCK_LAB_SUBNET; default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("build", help="build the node image unless cached")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p = sub.add_parser("up", help="make the lab run N job nodes (and the backend nodes), all booted")
    p.add_argument("--nodes", type=int, default=3, help="number of job nodes, group dlock_nodes (default 3)")
    p.add_argument("--backend", dest="backends", action="store_const", const=1, default=0,
                   help="also run PREFIX-backend at .10, group dlock_backend (as --backends 1)")
    p.add_argument("--backends", dest="backends", type=int,
                   help=f"run N backend nodes, group dlock_backend: PREFIX-backend at .10 for 1, "
                        f"PREFIX-b1..bN at .2.. for more (at most {MAX_BACKENDS}; e.g. 3 for an etcd cluster)")
    p.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for boot")
    sub.add_parser("down", help="stop all nodes and remove everything with the prefix (idempotent)")
    p = sub.add_parser("status", help="nodes, pids, addresses, state")
    p.add_argument("--json", action="store_true")
    sub.add_parser("inventory", help="print the path of the Ansible inventory")
    p = sub.add_parser("ssh", help="ssh into a node: ssh NODE [-- CMD...]")
    p.add_argument("node")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    for name, text in [("stop", "clean poweroff (disk state kept)"),
                       ("crash", "SIGKILL the node and all its processes"),
                       ("start", "boot a stopped or crashed node and wait for it"),
                       ("partition", "cut the node off the network"),
                       ("heal", "reconnect a partitioned node"),
                       ("undelay", "remove delay/loss")]:
        sub.add_parser(name, help=text).add_argument("node")
    p = sub.add_parser("delay", help="delay packets to the node by MS (round trips +MS)")
    p.add_argument("node")
    p.add_argument("ms", type=float)
    p.add_argument("--loss", type=float, default=0.0, help="also drop PCT %% of them")
    for name, text in [("pause", "SIGSTOP the node's processes whose command line matches PATTERN (regex)"),
                       ("resume", "SIGCONT them")]:
        p = sub.add_parser(name, help=text)
        p.add_argument("node")
        p.add_argument("pattern")
    p = sub.add_parser("_netem")  # internal: the delay helper, run inside a node's netns
    p.add_argument("node")
    p.add_argument("ms", type=float)
    p.add_argument("loss", type=float)
    p.add_argument("report")

    args = parser.parse_args(argv)
    try:
        if args.command == "_netem":
            netem(args.ms, args.loss, args.report)
        lab = Lab(args.prefix, args.subnet)
        started = time.monotonic()
        if args.command == "build":
            sys.stdout.write(lab.build_image(force=args.force) + "\n")
        elif args.command == "up":
            names = lab.up(args.nodes, timeout=args.timeout, backends=args.backends)
            sys.stdout.write(f"up: {len(names)} nodes running after {time.monotonic() - started:.1f}s; "
                             f"inventory {lab.inventory}\n")
            memory = sorted(node_memory_kib(name) or 0 for name in names)
            sys.stdout.write(f"up: memory (Pss) {sum(memory) / 1024:.0f}MiB in all; a node "
                             f"{memory[0] / 1024:.0f}-{memory[-1] / 1024:.0f}MiB, median "
                             f"{memory[len(memory) // 2] / 1024:.0f}MiB\n")
        elif args.command == "down":
            lab.down()
            sys.stdout.write(f"down: lab {lab.prefix} removed in {time.monotonic() - started:.1f}s\n")
        elif args.command == "status":
            entries = lab.status()
            if args.json:
                sys.stdout.write(json.dumps(entries, indent=2) + "\n")
            elif not entries:
                sys.stdout.write(f"lab {lab.prefix}: no nodes\n")
            for e in [] if args.json else entries:
                delay = f"{e['delay']['ms']:g}ms/{e['delay']['loss']:g}%" if e["delay"] else "-"
                memory = "-" if e["memory_kib"] is None else f"{e['memory_kib'] / 1024:.0f}MiB"
                sys.stdout.write(f"{e['name']:<16} {e['group']:<14} {e['addr']:<12} pid={e['pid'] or '-':<8} "
                                 f"{'running' if e['running'] else 'stopped':<8} link={e['link']:<5} "
                                 f"delay={delay:<10} mem={memory:<9} system={e['system']}\n")
        elif args.command == "inventory":
            if not os.path.exists(lab.inventory):
                raise LabError(f"lab {lab.prefix} is not up")
            sys.stdout.write(lab.inventory + "\n")
        elif args.command == "ssh":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            tty = ["-t"] if not cmd and sys.stdin.isatty() else []
            argv = lab.ssh_argv(args.node, shared=False)  # a terminal: see ssh_argv
            os.execvp("ssh", argv[:1] + tty + argv[1:] + cmd)  # ssh joins CMD for the remote shell
        elif args.command in ("pause", "resume"):
            pids = getattr(lab, args.command)(args.node, args.pattern)
            sys.stdout.write(f"{args.command}d pids {' '.join(map(str, pids))}\n")
        elif args.command == "delay":
            lab.delay(args.node, args.ms, args.loss)
        else:  # stop, crash, start, partition, heal, undelay
            getattr(lab, args.command)(args.node)
    except LabError as e:
        sys.stderr.write(f"lab: error: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
