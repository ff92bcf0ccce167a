"""tls: from Python: the tls_* options reach the library; a refused certificate is a
PermissionError. Certificates are made at test time with the `cryptography` package
(scripts/python.sh installs it)."""

import datetime
import ipaddress
import threading

import pytest

import shmlink
import peers
from conftest import require

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - reported as a skip
    x509 = None


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(tmp_path, tag):
    """A CA and a server certificate it signed for 127.0.0.1; returns the file paths."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"test CA {tag}"))
          .issuer_name(_name(f"test CA {tag}")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {}
    for name, data in [("ca", ca.public_bytes(serialization.Encoding.PEM)),
                       ("cert", cert.public_bytes(serialization.Encoding.PEM)),
                       ("key", _key_pem(key))]:
        p = tmp_path / f"{tag}-{name}.pem"
        p.write_bytes(data)
        paths[name] = str(p)
    return paths


@pytest.fixture
def pki(tmp_path):
    if x509 is None:
        require("python-cryptography", "the cryptography package is not installed")
    return make_pki(tmp_path, "a"), make_pki(tmp_path, "b")


def test_tls_echo_and_a_refused_certificate(pki):
    good, other = pki
    with shmlink.listen("tls:127.0.0.1:0", tls_cert=good["cert"], tls_key=good["key"]) as listener:
        addr = listener.local_addr
        client, server = peers.pair(listener, addr, tls_ca=good["ca"])
        assert client.transport == "tls"
        client.send(b"over tls")
        assert server.recv() == b"over tls"
        client.close()
        with pytest.raises(EOFError):
            server.recv()
        server.close()

        # A client that trusts another CA refuses the listener's certificate.
        listener.setblocking(False)
        stop = threading.Event()

        def serve():
            while not stop.is_set():
                try:
                    listener.accept().close()
                except (BlockingIOError, OSError):
                    stop.wait(0.01)

        t = threading.Thread(target=serve)
        t.start()
        try:
            with pytest.raises(PermissionError) as e:
                shmlink.connect(addr, tls_ca=other["ca"], connect_timeout=10)
            assert e.value.errno == 13  # EACCES
        finally:
            stop.set()
            t.join(10)
    with pytest.raises(ValueError):
        shmlink.connect(addr, tls_ca=str(good["ca"]) + ".missing")
