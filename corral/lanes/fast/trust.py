"""What a pool's workers are given to join it, and how the gateway knows them.

Each pool has a certificate authority of its own, made in memory when the pool is made
and never written anywhere: it signs the pool's scheduler certificate (the gateway's,
held in memory) and one worker certificate, for the pool's Unix user, and its key is
then dropped. A worker proves it is the pool's (TLS client authentication against the
pool's CA) and can neither sign another certificate nor pose as the scheduler (its
certificate is for client authentication alone). Before (issue 47), the pool's one key
was the CA's, the scheduler's and every worker's, in a file of the pool's user.

What the workers read lies in ``fastlane/pilots/<slug>/``, root's throughout (0711:
reached by name, nothing listed): ``ca.pem`` and ``cert.pem`` (0644), ``key.pem`` (0600,
the pool's user's), and ``sandbox.json`` (0644) when the facility contains tasks. Root
writes there only, never in the pool's own directory (``fastlane/<slug>/``, its user's),
where each name could be a link its user put there: before, a restarted gateway wrote
and chowned the TLS files through such links (``tls/key.pem`` linked to /etc/shadow made
that file the user's) and wrote the sandbox profile through one.
"""

from __future__ import annotations

import datetime
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PILOTS = "pilots"
"""Under the fast lane's directory: one directory of root's per pool (a slug always has
two dashes, so no pool's own directory has this name)."""
CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"
SANDBOX_FILE = "sandbox.json"
"""The facility's sandbox, which a pool's workers wrap contained tasks with."""


def files_of(pool_dir: Path) -> Path:
    """Where the workers of the pool whose own directory is ``pool_dir`` find their files."""
    return pool_dir.parent / PILOTS / pool_dir.name


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _sign(subject: str, key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate | None,
          ca_key: ec.EllipticCurvePrivateKey, usage: x509.ObjectIdentifier | None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    pub = key.public_key()
    b = (x509.CertificateBuilder().subject_name(_name(subject))
         .issuer_name(ca_cert.subject if ca_cert is not None else _name(subject))
         .public_key(pub).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         # Bounded by the gateway's run: the next run makes a new CA, and nothing of this one
         # is trusted then. No revocation is needed: the CA signs twice and is gone.
         .not_valid_after(now + datetime.timedelta(days=3650))
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False))
    if ca_cert is None:
        b = (b.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                          crl_sign=True, encipher_only=False, decipher_only=False), critical=True))
    else:
        assert usage is not None
        b = (b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                          crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    return b.sign(ca_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(directory: Path, name: str, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """A new file in a directory of root's: whatever was at the name is removed first."""
    path = directory / name
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def own_dir(path: Path) -> None:
    """``path`` made (or found) a directory of this process's user, 0711, never a link."""
    try:
        path.mkdir(mode=0o711)
    except FileExistsError:
        pass
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of the gateway's own")
    path.chmod(0o711)


def issue(pool_dir: Path, slug: str, owner: tuple[int, int] | None, sandbox: str | None) -> ssl.SSLContext:
    """Make the pool's CA, sign the scheduler's certificate and its workers', write what the
    workers read (and ``sandbox``, the profile, when given) where ``files_of`` says, the
    key ``owner``'s; -> the scheduler's TLS context. The CA's key is not kept."""
    top = pool_dir.parent / PILOTS
    own_dir(top)
    d = top / pool_dir.name
    own_dir(d)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _sign(f"corral fast-lane pool {slug}", ca_key, None, ca_key, None)
    server_key, worker_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = _sign(f"scheduler {slug}", server_key, ca, ca_key, ExtendedKeyUsageOID.SERVER_AUTH)
    worker = _sign(f"worker {slug}", worker_key, ca, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    del ca_key
    _write(d, CA, _pem(ca), 0o644)
    _write(d, CERT, _pem(worker), 0o644)
    _write(d, KEY, _key_pem(worker_key), 0o600, owner)
    if sandbox is not None:
        _write(d, SANDBOX_FILE, sandbox.encode(), 0o644)
    else:
        try:
            os.unlink(d / SANDBOX_FILE)
        except FileNotFoundError:
            pass
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=_pem(ca).decode())
    # ssl loads a key only from a path: a memory file, gone when closed (nothing at rest).
    fd = os.memfd_create("corral-scheduler-key", os.MFD_CLOEXEC)
    try:
        os.write(fd, _pem(server) + _key_pem(server_key))
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ctx


def worker_context(directory: Path) -> ssl.SSLContext:
    """A worker's TLS: its own certificate and key, and only its pool's scheduler trusted
    (a certificate the pool's CA issued for a server; the name is not checked, the CA
    signs for this pool alone)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(str(directory / CA))
    ctx.load_cert_chain(str(directory / CERT), str(directory / KEY))
    return ctx
