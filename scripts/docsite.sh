#!/usr/bin/env bash
# The collection's documentation as docs.ansible.com renders it: the module,
# the action plugin, the filters and the roles' argument specs checked by
# antsibull-docs (lint-collection-docs), then the docsite that
# `antsibull-docs sphinx-init` lays out, built by Sphinx with warnings as
# errors, into build/docsite/build/html. Offline: scripts/docsite_inventories.py
# stands in for the inventories of docs.ansible.com and docs.python.org.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dest=$root/build/docsite
export PATH=$root/.venv/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$root/build  # build/ansible_collections/dlock/fleet: this checkout (scripts/setup.sh)

antsibull-docs lint-collection-docs --plugin-docs build/ansible_collections/dlock/fleet
rm -rf "$dest"
mkdir -p "$dest"
antsibull-docs sphinx-init --use-current --dest-dir "$dest" dlock.fleet >/dev/null
python3 scripts/docsite_inventories.py "$dest"
bash "$dest/build.sh"
