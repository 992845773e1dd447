"""The config keys of the section "TLS" of docs/config.md: upstream's certificate settings
of its tls transport.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import Key, in_group
from monarch._src.config.kinds import PEM

#: The docs section these keys are listed in.
GROUP = "TLS"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
        Key(
            "hyperactor_tls_ca",
            "HYPERACTOR_TLS_CA",
            PEM,
            "/etc/hyperactor/tls/ca.crt",
            "The CA certificate of the tls transport: a path or PEM text. Not passed "
            "to spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_CA and MONARCH_TLS_KEY "
            "(see docs/security.md).",
        ),
        Key(
            "hyperactor_tls_cert",
            "HYPERACTOR_TLS_CERT",
            PEM,
            "/etc/hyperactor/tls/tls.crt",
            "The certificate of the tls transport: a path or PEM text. Not passed to "
            "spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_KEY and MONARCH_TLS_CERT "
            "(see docs/security.md).",
        ),
        Key(
            "hyperactor_tls_key",
            "HYPERACTOR_TLS_KEY",
            PEM,
            "/etc/hyperactor/tls/tls.key",
            "The private key of the tls transport: a path or PEM text. Not passed to "
            "spawned procs.",
            propagate=False,
            ignored="There is no separate 'tls' transport here: TCP connections are mutual TLS "
            "with the files given as ca= and private_key= or MONARCH_TLS_KEY (see "
            "docs/security.md).",
        ),
    ),
]
