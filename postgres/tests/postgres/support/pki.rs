//! A CA the tests make, certificates it signs, and a server that takes TLS only.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tower_lease_harness::{PgServer, PgSetup};

/// A CA, a server certificate it signed for `localhost` and 127.0.0.1, and a client
/// certificate it signed for the user `postgres`, with their keys, in PEM.
pub struct Pki {
    pub ca: String,
    pub cert: String,
    pub key: String,
    pub client_cert: String,
    pub client_key: String,
}

pub fn make_pki(name: &str) -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, name);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    // The server's `cert` authentication takes the user from the common name.
    client
        .distinguished_name
        .push(DnType::CommonName, "postgres");
    let client_cert = client.signed_by(&client_key, &ca).unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        client_cert: client_cert.pem(),
        client_key: client_key.serialize_pem(),
    }
}

/// A server with `pki`'s certificate that refuses connections without TLS over TCP.
pub fn tls_server(pki: &Pki) -> PgServer {
    PgServer::start_with(
        PgSetup::default()
            .file("server.crt", pki.cert.as_bytes())
            .file("server.key", pki.key.as_bytes())
            .setting("ssl", "on")
            .setting("ssl_cert_file", "server.crt")
            .setting("ssl_key_file", "server.key")
            .hba("local all all trust\nhostssl all all 127.0.0.1/32 trust\n"),
    )
}

/// A server with `pki`'s certificate that takes TLS connections over TCP only, each with a
/// client certificate `pki`'s CA signed for the user it connects as (`cert` authentication).
pub fn client_certificate_server(pki: &Pki) -> PgServer {
    PgServer::start_with(
        PgSetup::default()
            .file("server.crt", pki.cert.as_bytes())
            .file("server.key", pki.key.as_bytes())
            .file("clients.crt", pki.ca.as_bytes())
            .setting("ssl", "on")
            .setting("ssl_cert_file", "server.crt")
            .setting("ssl_key_file", "server.key")
            .setting("ssl_ca_file", "clients.crt")
            .hba("local all all trust\nhostssl all all 127.0.0.1/32 cert\n"),
    )
}

/// Writes `contents` to a file of its own in the temporary folder, named after `name` and
/// this process; answers its path.
pub fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tower-lease-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).expect("write a temporary file");
    path
}

/// `e` and its sources, as one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line += &format!(": {s}");
        source = s.source();
    }
    line
}
