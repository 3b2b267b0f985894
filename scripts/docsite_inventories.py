"""Offline stand-ins for the intersphinx inventories that antsibull-docs'
Sphinx configuration (sphinx-init) names beside each URL: DEST/python2.inv,
python3.inv, jinja2.inv and ansible_devel.inv.

The machines that build the docsite reach no documentation site, so Sphinx
would warn about every inventory (and the build treats warnings as errors).
What the collection's pages link to outside themselves is a few labels of
the Ansible documentation, written by antsibull-docs' own templates (the
action plugin note, the common return values, the configuration settings):
ANSIBLE_LABELS maps them to their pages on docs.ansible.com. A label the
pages use that is missing here is still an undefined reference, and so a
failed build that names it.

Usage: docsite_inventories.py DEST
"""

import sys
import zlib

ANSIBLE_LABELS = {
    "action_plugins": ("plugins/action.html#action-plugins", "Action plugins"),
    "common_return_values": ("reference_appendices/common_return_values.html#common-return-values",
                             "Return Values"),
    "ansible_configuration_settings": ("reference_appendices/config.html#ansible-configuration-settings",
                                       "Ansible Configuration Settings"),
}
INVENTORIES = {"python2": {}, "python3": {}, "jinja2": {}, "ansible_devel": ANSIBLE_LABELS}


def inventory(project, labels):
    """Sphinx's inventory format, version 2: a plain header, then one zlib
    stream of `name domain:role priority uri display-name` lines."""
    header = ("# Sphinx inventory version 2\n# Project: %s\n# Version: offline\n"
              "# The remainder of this file is compressed using zlib.\n" % project)
    lines = "".join("%s std:label -1 %s %s\n" % (name, uri, title) for name, (uri, title) in sorted(labels.items()))
    return header.encode() + zlib.compress(lines.encode())


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: docsite_inventories.py DEST")
    for name, labels in INVENTORIES.items():
        with open("%s/%s.inv" % (argv[1], name), "wb") as handle:
            handle.write(inventory(name, labels))


if __name__ == "__main__":
    main(sys.argv)
