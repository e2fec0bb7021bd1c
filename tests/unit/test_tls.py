"""Certificates for the control plane and the webhook, made with `cryptography`."""

from __future__ import annotations

import ipaddress

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cozygpu import tls


def test_serving_certificate_is_signed_by_the_ca_and_names_its_hosts() -> None:
    """A serving leaf carries IP and DNS SANs and verifies against the CA."""
    ca = tls.Authority()
    leaf = tls.Authority.serving(ca, ["127.0.0.1", "localhost"])
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    root = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(root)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage


def test_client_certificate_carries_user_and_group() -> None:
    """The API server reads CN as the user and O as a group."""
    ca = tls.Authority()
    pair = ca.client("admin", "system:masters")
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
