#!/bin/sh
# Ad-hoc calls of the dlock module from a shell: look at a lock, break a stale
# one. The backend comes from the inventory variable dlock_backend (put the
# password there or in backend_password_file, never on this command line),
# or, without it, from the record site.yml wrote of the backend it provisioned
# (credentials/dlock-backend.json beside INVENTORY).
#
#   sh examples/adhoc.sh INVENTORY KEY
set -eu
inventory=${1:?usage: adhoc.sh INVENTORY KEY}
key=${2:?usage: adhoc.sh INVENTORY KEY}

# Who holds it, for how long, with which fencing token.
ansible localhost -i "$inventory" -m dlock.fleet.dlock -a "key=$key state=query"

# What breaking it would do (changes nothing), then break it, saying why.
ansible localhost -i "$inventory" -m dlock.fleet.dlock -a "key=$key state=released force=true reason='holder crashed'" --check --diff
ansible localhost -i "$inventory" -m dlock.fleet.dlock -a "key=$key state=released force=true reason='holder crashed'" --diff

# The runbooks do the same for several keys.
ansible-playbook -i "$inventory" dlock.fleet.status -e "dlock_keys=$key"
