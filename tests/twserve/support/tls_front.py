"""A TLS front for a mock upstream, for tests of ``wss://`` upstreams.

`certificates` makes a throw-away certificate authority and a server certificate for 127.0.0.1
with the ``cryptography`` package; `tls_front` serves TLS on a loopback port and passes the bytes
to a plain port (the mock's), so a provider's ``https://127.0.0.1:<port>`` base URL reaches the
mock over TLS. The gateway checks certificates against the default store, which reads
``SSL_CERT_FILE``: tests point it at the authority's file.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSListener
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """The authority's PEM file, and a server context holding a certificate it signed."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "twserve test authority")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = folder / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = folder / "server.pem"
    chain.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain)
    return ca_file, context


@asynccontextmanager
async def tls_front(context: ssl.SSLContext, target_port: Callable[[], int]) -> AsyncIterator[int]:
    """Serve TLS on a loopback port (yielded) in front of ``127.0.0.1:<target_port()>``."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)
    tls = TLSListener(listener, context, standard_compatible=False)

    async def pipe(
        src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream, scope: anyio.CancelScope
    ) -> None:
        with suppress(Exception):
            async for chunk in src:
                await dst.send(chunk)
        scope.cancel()

    async def handle(client: anyio.abc.ByteStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", target_port())
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, upstream, tg.cancel_scope)
                tg.start_soon(pipe, upstream, client, tg.cancel_scope)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(tls.serve, handle)
            try:
                yield port
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), suppress(Exception):
            await tls.aclose()
