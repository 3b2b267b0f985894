"""The etcd keys of a lock, under the URL's prefix P (default /dlock; an etcd
role with a readwrite permission on the prefix P/ suffices):
  P/KEY/lock    JSON {owner, acquired_at}, attached to the holder's lease
  P/KEY/fence   empty, written in every grant: its mod_revision is the last fence
  P/KEY/slot/N  once-per marker of slot N (slots.py: the owner, or the outcome), with its own lease
  P/KEY/last    JSON of the last finished run
  P/KEY/queue/OWNER  a waiter's ticket, attached to a lease of its own
  P/KEY/history/run/OWNER, P/KEY/history/once/ID  an entry of the history
                (base.history_record), in the order of their create_revision
  P/_pause/all, P/_pause/job/KEY, P/_pause/group/NAME  a pause (base.pause_scopes)
                of every lock, of KEY's, of a group's: its record (base.Pause), attached to a lease of its own
                whose TTL is the pause's length
Lock keys cannot hold '/', so no key's names reach into another key's; nor
start with '_', so no key's names reach into the pauses'.
"""

from .base import scope_parts


class KeyNames(object):
    """The names of a lock's keys under one prefix."""

    def __init__(self, prefix):
        self.prefix = prefix

    def base(self, key):
        """What every name of key starts with."""
        return "%s/%s/" % (self.prefix, key)

    def lock(self, key):
        return self.base(key) + "lock"

    def fence(self, key):
        return self.base(key) + "fence"

    def last(self, key):
        return self.base(key) + "last"

    def queue(self, key):
        return self.base(key) + "queue/"

    def history(self, key):
        return self.base(key) + "history/"

    def marker(self, key, slot):
        return self.base(key) + "slot/%d" % slot.number

    def pause(self, scope):
        kind, name = scope_parts(scope)
        return "%s/_pause/%s" % (self.prefix, kind if name is None else "%s/%s" % (kind, name))
