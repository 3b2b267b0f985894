"""The dlock_etcd README's membership procedures, done as written on the lab:
a member replaced (removed, its data gone, added back as a new member), then
the cluster grown from 3 to 5 members, one at a time. (Adding both before
starting either, as this README first said, fails: etcd answers "unhealthy
cluster" to the second `member add`.) Between steps a runner takes a grant;
after each, the role's own health check passes on every member, etcd lists
exactly the inventory's members, the lock data survived (fences only grow),
and the runners' URL names every member.

On the etcd lab, after the fault tests (conftest's etcd_lab): they want the
three members of the etcd scenario's rollout, these leave five. Every step's
rollout is the scenario's (client and peer TLS; its prepare step makes a new
member's certificate), with the procedure's inventory on top."""

import json
import os

import pytest
import scenario
from rollout import node_config, read_password, shape

pytestmark = pytest.mark.lab

PROBE = "members-probe"
SCENARIO = "etcd"
# The scenario's members speak TLS only, to clients and to each other.
CA_FILE = scenario.group_vars(SCENARIO)["dlock_backend"]["dlock_etcd_tls_ca_file"]


def peer_url(lab, member):
    return "https://%s:2380" % lab.addr(member)


@pytest.fixture(scope="module")
def members_lab(etcd_lab):
    """The etcd lab as the scenario converged it (test_etcd_faults' rollout:
    no new one when that module ran first)."""
    return scenario.converged(etcd_lab, SCENARIO)


def converge_joining(lab, joining):
    """The procedure's rollout: the scenario's, with JOINING (new members)
    set to join the existing cluster rather than form one."""
    scenario.converge(lab, SCENARIO, None, "-i", existing_inventory(lab, joining))


def etcdctl(lab, on, *args):
    """etcdctl as root on member ON, against its own endpoint; the password on
    stdin (etcdctl prompts for it, and prints the prompt on stdout)."""
    command = "etcdctl --endpoints=https://%s:2379 --cacert %s --user root --dial-timeout=5s --command-timeout=15s %s" % (
        lab.addr(on), CA_FILE, " ".join(args))
    done = lab.ssh(on, command, input=read_password(lab, admin=True) + "\n")
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout.replace("Password: ", "")


def members(lab, on):
    """{name: (hex id, peer URLs, started)} as etcd lists them."""
    listed = json.loads(etcdctl(lab, on, "-w", "json", "member", "list"))["members"]
    return dict((m.get("name", ""), ("%x" % m["ID"], m.get("peerURLs", []), bool(m.get("name")))) for m in listed)


def grant_fence(lab):
    """A grant on the first job node: the fence it got (from the run's log line)."""
    node = lab.group("dlock_nodes")[0]
    # A generous op_timeout: this checks membership, not latency, and a write
    # that a majority fsyncs can take over the default 2 s on a loaded lab host.
    done = lab.ssh(node, "dlock run --job %s --op-timeout 6s -- true" % PROBE)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    fences = [line["fence"] for line in lines if "fence" in line]
    assert fences, done.stderr
    return fences[-1]


def existing_inventory(lab, hosts):
    """A second inventory setting dlock_etcd_initial_cluster_state: existing on
    HOSTS (the procedure's step: they join rather than form a cluster)."""
    path = os.path.join(lab.state_dir, "etcd-existing.json")
    with open(path, "w") as handle:
        json.dump({"dlock_backend": {"hosts": dict((h, {"dlock_etcd_initial_cluster_state": "existing"})
                                                   for h in hosts)}}, handle)
    return path


def assert_cluster_is_the_inventory(lab):
    backends = lab.group("dlock_backend")
    listed = members(lab, backends[0])
    assert sorted(listed) == sorted(backends), listed
    for name, listing in listed.items():
        assert listing[2] and listing[1] == [peer_url(lab, name)], (name, listing)  # started, peer URLs
    health = json.loads(etcdctl(lab, backends[0], "-w", "json", "endpoint", "health", "--cluster"))
    assert len(health) == len(backends) and all(h["health"] for h in health), health
    url = node_config(lab)["backend"]
    for name in backends:
        assert "%s:2379" % lab.addr(name) in url, (name, url)


def test_a_member_is_replaced_as_the_readme_says(members_lab):
    lab = members_lab
    backends = lab.group("dlock_backend")
    assert len(backends) == 3, backends
    first, old = backends[0], backends[-1]
    before = grant_fence(lab)
    old_id = members(lab, first)[old][0]
    # 1. Remove the old member (the cluster runs on two, quorum two) ...
    etcdctl(lab, first, "member", "remove", old_id)
    assert grant_fence(lab) > before  # two of two still grant
    # ... the machine comes back empty: a removed member must never start with its old data.
    lab.ssh(old, "systemctl stop etcd && rm -rf /var/lib/etcd/dlock", check=True)
    # 2. Add it as a new member, 3. with initial_cluster_state existing, 4. run the role.
    etcdctl(lab, first, "member", "add", old, "--peer-urls=" + peer_url(lab, old))
    converge_joining(lab, [old])
    assert members(lab, first)[old][0] != old_id  # a new member, not the old one back
    assert_cluster_is_the_inventory(lab)
    assert grant_fence(lab) > before  # the lock data (and its revision) survived the change


def test_two_members_are_added_as_the_readme_says(members_lab):
    """One at a time (etcd will not add a member while the last one added has
    not joined): 3, then 4, then 5, each joined before the next is added.
    Starts from the three members the replacement above left whole."""
    lab = members_lab
    first = lab.group("dlock_backend")[0]
    before = grant_fence(lab)
    joined = []
    for size in (4, 5):
        lab.up(nodes=len(lab.group("dlock_nodes")), backends=size)
        new = [name for name in lab.group("dlock_backend") if name not in members(lab, first)]
        assert len(new) == 1, new
        # 1. Add it, 2. existing on it, 3. site.yml on the whole group (and the nodes' URL).
        etcdctl(lab, first, "member", "add", new[0], "--peer-urls=" + peer_url(lab, new[0]))
        assert grant_fence(lab) > before  # the quorum holds while the new member is not there yet
        joined += new
        converge_joining(lab, joined)
        assert_cluster_is_the_inventory(lab)
        assert grant_fence(lab) > before
    assert shape(lab, "etcd") == lab.group("dlock_backend")  # five stay five for etcd
