"""The TLS context of a backend spoken to with the standard library (etcd's
gateway, Redis): one rule for which CA is trusted and what is checked."""

import ssl

from ..errors import ConfigError


def tls_context(ca_file=None, cert=None, key_file=None):
    """Verify the server against CA_FILE alone when given (not a bundle the
    environment names: SSL_CERT_FILE is only read for the system's default),
    else against the system's CAs; its name or address is checked as well.
    CERT and KEY_FILE: our client certificate."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
        if cert:
            context.load_cert_chain(cert, key_file)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigError("backend: cannot load the TLS %s: %s"
                          % ("CA file %s" % ca_file if ca_file else "client certificate", exc))
    return context
