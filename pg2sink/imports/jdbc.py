"""Which libpq connection settings reach an import's JDBC reads, and how.

An import's readers are Spark's JDBC source, the PostgreSQL JDBC driver (pgjdbc), not
libpq. What they connect to (host, port, database, user, password) is what libpq
resolved for the runner's own connection (`conn.info`: from the DSN, the environment, a
service or password file). Every other libpq setting of that connection
(`ConnectionInfo.get_parameters()`: those with a value other than libpq's default) is
either passed as the pgjdbc property with the same meaning (`PASSED`), or without effect
on what a reader reads or how safely it connects (`WITHOUT_EFFECT`: the choice between
hosts, names and TCP tuning), or refused: a reader without it would connect differently
from what the user asked, e.g. without a CRL or a client-certificate rule. A refusal is
a ConfigError at the start of `pg2sink stream` (engine.ImportEngine), not a job failing and
retrying forever.

Keys (https://jdbc.postgresql.org/documentation/ssl/): libpq reads `sslkey` as PEM
only; pgjdbc reads a file named *.key or *.pem as an unencrypted PKCS-8 PEM key
(`-----BEGIN PRIVATE KEY-----`, RSA unless told `pemKeyAlgorithm`), any other name as
PKCS-8 DER. So the one key both can read is an unencrypted PKCS-8 PEM file named *.key
or *.pem; `key_properties` checks that at start and names the openssl command otherwise.
`sslpassword` is a secret: passed, never logged or quoted.
"""

from __future__ import annotations

import base64
import binascii
import re

from psycopg import ConnectionInfo

from pg2sink.errors import ConfigError

__all__ = ["PASSED", "WITHOUT_EFFECT", "connection_properties", "key_properties"]

#: libpq keyword -> the pgjdbc property of the same meaning and values
PASSED = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "sslnegotiation": "sslNegotiation",
    "channel_binding": "channelBinding",
    "gssencmode": "gssEncMode",
    "gsslib": "gsslib",
    "krbsrvname": "kerberosServerName",
    "connect_timeout": "connectTimeout",
    "options": "options",
}

#: libpq keywords resolved by the runner's connection (the JDBC URL and user come from
#: it) or without effect on what a reader reads or how safely it connects
WITHOUT_EFFECT = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
        "application_name",
        "fallback_application_name",
        "client_encoding",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "sslcompression",
        "sslsni",
        "requiressl",
    }
)

#: libpq keywords imports honour at their default value only (pgjdbc behaves so)
DEFAULT_ONLY = {
    "sslcertmode": "allow",
    "gssdelegation": "0",
    "ssl_min_protocol_version": "TLSv1.2",
}

#: DER of the AlgorithmIdentifier OIDs a PKCS-8 key starts with -> pemKeyAlgorithm
_KEY_ALGORITHMS = {
    bytes.fromhex("06092a864886f70d010101"): "RSA",  # rsaEncryption
    bytes.fromhex("06072a8648ce3d0201"): "EC",  # id-ecPublicKey
}
_PKCS8_PEM = re.compile(rb"-----BEGIN PRIVATE KEY-----(.+?)-----END PRIVATE KEY-----", re.S)


def _refuse(what: str) -> ConfigError:
    return ConfigError(f"imports cannot honour {what}; fix --source or stream with --no-imports")


def connection_properties(info: ConnectionInfo) -> dict[str, str]:
    """The pgjdbc properties for the libpq settings of `info`'s connection (see the
    module docstring); ConfigError for a setting imports cannot honour."""
    if info.host.startswith("/"):
        raise ConfigError(
            "imports read through JDBC, which needs a TCP host: give --source a host= "
            f"(not the Unix socket directory {info.host})"
        )
    props: dict[str, str] = {}
    for key, value in sorted(info.get_parameters().items()):
        if key in WITHOUT_EFFECT:
            continue
        if key in DEFAULT_ONLY:
            if value != DEFAULT_ONLY[key]:
                raise _refuse(f"the connection setting {key} (only its default)")
        elif key == "sslrootcert" and value == "system":
            raise _refuse("sslrootcert=system (give the CA certificate file)")
        elif key == "sslkey":
            props.update(key_properties(value))
        elif key in PASSED:
            props[PASSED[key]] = value
        else:
            raise _refuse(f"the connection setting {key} (pgjdbc has no equivalent)")
    return props


def key_properties(path: str) -> dict[str, str]:
    """sslkey (and pemKeyAlgorithm) for the key file `path`, which libpq reads as PEM;
    ConfigError when pgjdbc cannot read the same file."""
    fix = "openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.key, then chmod 600 KEY.key"
    if not path.endswith((".key", ".pem")):
        raise _refuse(f"sslkey {path} (name it *.key or *.pem, as pgjdbc reads those as PEM)")
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read sslkey {path}: {e.strerror}") from None
    found = _PKCS8_PEM.search(text)
    try:
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True) if found else b""
    except binascii.Error:
        der = b""
    algorithm = next((a for oid, a in _KEY_ALGORITHMS.items() if oid in der[:32]), None)
    if algorithm is None:
        raise _refuse(
            f"sslkey {path}: pgjdbc reads only an unencrypted PKCS-8 RSA or EC key "
            f"(-----BEGIN PRIVATE KEY-----); convert it: {fix}"
        )
    return {"sslkey": path, "pemKeyAlgorithm": algorithm}
