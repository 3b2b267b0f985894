"""A switchover of the Patroni cluster (patronictl switchover to the
synchronous standby) while the fleet runs: the cluster is back with a new
leader and a synchronous standby, the runners reconnect through their
multi-host URL to the new primary, and every grant after it carries a
fencing token strictly larger than every grant before it. The times are
printed and written to the scenario's ephemeral directory."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

from fleet_checks import EPHEMERAL  # noqa: E402

# Run once, from the first member (patronictl reaches the leader's REST API
# from a member's address, with the REST API's user from the configuration).
testinfra_hosts = ["ansible://mlh-b1"]

KEY = "ha-switchover"
GRANT = "dlock run --job %s --ttl 20s -- sh -c 'echo $DLOCK_FENCING_TOKEN'" % KEY
DEADLINE = 90  # seconds: a switchover takes one or two of Patroni's loops (loop_wait 10 s)


def patroni_members(host):
    """{role: [names]} as patronictl list shows them (read from etcd)."""
    rows = json.loads(host.check_output("patronictl -c /etc/patroni/config.yml list -f json"))
    roles = {}
    for row in rows:
        if row["State"] in ("running", "streaming"):
            roles.setdefault(row["Role"], []).append(row["Member"])
    return roles


def grant(node):
    """A grant of KEY on the node: its fencing token, or None when refused."""
    done = node.run(GRANT)
    return int(done.stdout.strip()) if done.rc == 0 else None


def test_a_switchover_keeps_the_grants_and_their_fence_order(host):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    nodes = [host.get_host("ansible://" + name, ansible_inventory=inventory)
             for name in host.ansible.get_variables()["groups"]["dlock_nodes"]]
    before = [grant(node) for node in nodes]
    assert None not in before and before == sorted(set(before)), before  # each grant a larger token

    roles = patroni_members(host)
    [leader], [standby] = roles["Leader"], roles["Sync Standby"]
    start = time.monotonic()
    done = host.run("patronictl -c /etc/patroni/config.yml switchover --leader %s --candidate %s --force",
                    leader, standby)
    assert done.rc == 0, done.stdout + done.stderr
    # Back in service: the standby leads, and a member (the old leader, or
    # the third) is its synchronous standby, every member running.
    while True:
        roles = patroni_members(host)
        if roles.get("Leader") == [standby] and roles.get("Sync Standby") and \
                sum(len(names) for names in roles.values()) == 3:
            break
        assert time.monotonic() - start < DEADLINE, "no leader %s with a synchronous standby: %s" % (standby, roles)
        time.sleep(0.5)
    cluster_ready = time.monotonic() - start
    # The runners find the new primary themselves (the URL names every member).
    while True:
        first = grant(nodes[0])
        if first is not None:
            break
        assert time.monotonic() - start < DEADLINE, "no grant after the switchover"
        time.sleep(0.5)
    first_grant = time.monotonic() - start
    after = [first] + [grant(node) for node in nodes[1:]]
    assert None not in after and after == sorted(set(after)), after
    assert min(after) > max(before), (before, after)
    report = {"old_leader": leader, "new_leader": standby, "switchover_seconds": round(cluster_ready, 1),
              "first_grant_seconds": round(first_grant, 1), "fences_before": before, "fences_after": after}
    print("\nswitchover %s -> %s: cluster ready after %.1fs, first grant after %.1fs; fences %s then %s"
          % (leader, standby, cluster_ready, first_grant, before, after))
    with open(os.path.join(EPHEMERAL, "switchover.json"), "w") as handle:
        json.dump(report, handle)
