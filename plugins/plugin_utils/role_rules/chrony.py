# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_chrony role's variables: their table and the rules between
them. Also conf_line, which the dlock_conf_line filter applies again where
chrony.conf is rendered."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    boolean, empty_or, hostname, integer, items, kind, network, number)

# chrony's options of server and pool lines (chrony 4): flags, and options
# taking a number. Anything else would stop chronyd from starting.
CHRONY_FLAGS = ("iburst", "burst", "prefer", "noselect", "trust", "require", "xleave", "offline", "auto_offline",
                "nts", "copy")
CHRONY_INTEGER_OPTIONS = {"minpoll": (-6, 24), "maxpoll": (-6, 24), "polltarget": (6, 60), "port": (1, 65535),
                          "presend": (-6, 24), "minsamples": (0, 64), "maxsamples": (0, 64), "filter": (1, 1024),
                          "version": (1, 4), "key": (1, 2 ** 32 - 1), "certset": (0, 2 ** 31 - 1),
                          "ntsport": (1, 65535)}
CHRONY_NUMBER_OPTIONS = ("maxdelay", "maxdelayratio", "maxdelaydevratio", "mindelay", "asymmetry", "offset")
DECIMAL = re.compile(r"-?[0-9]{1,9}(\.[0-9]{1,9})?")


def _option_argument(value, field, word, argument):
    """The number after option `word` of a server or pool line."""
    if word in CHRONY_INTEGER_OPTIONS:
        minimum, maximum = CHRONY_INTEGER_OPTIONS[word]
        if not re.fullmatch(r"-?[0-9]{1,10}", argument):
            raise ConfigError("%s: %s: %s needs a whole number" % (field, validate.shown(value), word))
        validate.integer(int(argument), "%s: %s" % (field, word), minimum, maximum)
    elif not DECIMAL.fullmatch(argument):
        raise ConfigError("%s: %s: %s needs a number" % (field, validate.shown(value), word))


def _source_options(value, field):
    """Options of chrony's server and pool lines, e.g. 'iburst minpoll 4':
    known flags, and known options each followed by a number."""
    validate.text(value, field, 200, allow_empty=True)
    words = value.split(" ")
    index = 0
    while index < len(words):
        word = words[index]
        if word in CHRONY_FLAGS:
            index += 1
            continue
        if word in CHRONY_INTEGER_OPTIONS or word in CHRONY_NUMBER_OPTIONS:
            if index + 1 >= len(words):
                raise ConfigError("%s: %s: %s needs a number" % (field, validate.shown(value), word))
            _option_argument(value, field, word, words[index + 1])
            index += 2
            continue
        raise ConfigError("%s: %s: %s is not an option of chrony's server and pool lines (flags: %s; with a number: "
                          "%s)" % (field, validate.shown(value), validate.shown(word), ", ".join(CHRONY_FLAGS),
                                   ", ".join(sorted(CHRONY_INTEGER_OPTIONS) + list(CHRONY_NUMBER_OPTIONS))))
    return value


def _conf_line(value, field):
    """One verbatim line of a line-oriented configuration file."""
    return validate.text(value, field, 1024)


conf_line = kind(_conf_line, "str")

TABLE = {
    "dlock_chrony_servers": items(hostname),
    "dlock_chrony_pools": items(hostname),
    "dlock_chrony_source_options": empty_or(_source_options),
    "dlock_chrony_makestep_threshold": number(0.001, 86400),
    "dlock_chrony_makestep_limit": integer(1, 1000),
    "dlock_chrony_slew_only": boolean,
    # ppm: at most half of the runners' 2% clock margin (the other half
    # is for the rate of the runner host's own clock).
    "dlock_chrony_maxslewrate": number(1, 10000),
    "dlock_chrony_allow": items(network, max_items=256),
    "dlock_chrony_local_stratum": integer(0, 15),
    "dlock_chrony_local_orphan": boolean,
    "dlock_chrony_container_mode": boolean,
    "dlock_chrony_wait_sync": boolean,
    "dlock_chrony_wait_sync_tries": integer(1, 100000),
    "dlock_chrony_wait_sync_interval": number(0.1, 3600),
    "dlock_chrony_wait_sync_max_correction": number(0.000001, 3600),
    "dlock_chrony_wait_at_boot": boolean,
    "dlock_chrony_extra_config": items(conf_line, max_items=256),
}

SECRETS = ()


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
    names = ("dlock_chrony_servers", "dlock_chrony_pools", "dlock_chrony_local_stratum")
    if all(name in values for name in names) and not (values["dlock_chrony_servers"] or values["dlock_chrony_pools"]
                                                      or int(values["dlock_chrony_local_stratum"]) > 0):
        yield ("dlock_chrony_servers, dlock_chrony_pools: no time source; set one of them (or, for a host that "
               "only serves its own clock, dlock_chrony_local_stratum)")
    if values.get("dlock_chrony_local_orphan") is True and int(values.get("dlock_chrony_local_stratum", 1)) == 0:
        yield ("dlock_chrony_local_orphan: needs dlock_chrony_local_stratum (orphan mode is a way of serving the "
               "local clock)")
    if values.get("dlock_chrony_slew_only") is True:
        for line in values.get("dlock_chrony_extra_config") or ():
            if line.split()[:1] in (["makestep"], ["maxslewrate"], ["initstepslew"]):
                yield ("dlock_chrony_extra_config: %s is not for a slew-only host (dlock_chrony_slew_only: the "
                       "clock must never step while the backend serves leases)" % validate.shown(line))
