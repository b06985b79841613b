//! TLS (first version, run against the code without TLS).

mod support;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tower_lease_harness::{PgServer, PgSetup};
use tower_lease_postgres::PgStore;

struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "tower-lease test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

fn tls_server(pki: &Pki) -> PgServer {
    PgServer::start_with(
        PgSetup::default()
            .file("server.crt", pki.cert_pem.as_bytes())
            .file("server.key", pki.key_pem.as_bytes())
            .setting("ssl", "on")
            .setting("ssl_cert_file", "server.crt")
            .setting("ssl_key_file", "server.key")
            .hba("local all all trust\nhostssl all all 127.0.0.1/32 trust\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_code() {
    let pki = pki();
    let _ = &pki.ca_pem;
    let server = tls_server(&pki);
    for url in [server.url(), format!("{}?sslmode=require", server.url())] {
        let started = std::time::Instant::now();
        let e = PgStore::connect(&url).await.unwrap_err();
        eprintln!("{url}: {e} ({:?})", started.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_code_chain() {
    let pki = pki();
    let server = tls_server(&pki);
    for url in [server.url(), format!("{}?sslmode=require", server.url())] {
        let e = PgStore::connect(&url).await.unwrap_err();
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain += &format!(": {s}");
            source = s.source();
        }
        eprintln!("{url}: {chain}");
    }
}
