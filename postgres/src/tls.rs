//! TLS to the server: what `sslmode` and `sslrootcert` in the URL of
//! [`connect`](crate::PgStoreBuilder::connect) mean here, and the connector (rustls, on the
//! `ring` provider, under the default feature `tls`) that the pool and the listener open their
//! connections with.
//!
//! - `sslmode=disable`: no TLS.
//! - `sslmode=prefer` (the default, as libpq's): TLS when the server offers it, plain text
//!   when it does not.
//! - `sslmode=require`: TLS or no connection.
//! - `sslmode=verify-ca`, `verify-full`: TLS or no connection, and the server's certificate
//!   verified, and so is its name (the URL's host, a DNS name or an IP address, against the
//!   certificate's subject alternative names), for `verify-ca` too.
//!
//! As libpq and sqlx do, `prefer` and `require` encrypt without authenticating the server
//! (a development server's self-signed certificate, as Debian's default one, is spoken to),
//! unless CAs are given: with `sslrootcert=<path to PEM>` in the URL or the builder's
//! [`root_certificates`](crate::PgStoreBuilder::root_certificates), every certificate is
//! verified in every mode, as libpq does with a root certificate file. The builder's
//! [`danger_accept_invalid_certificates`](crate::PgStoreBuilder::danger_accept_invalid_certificates)
//! turns verification off in every mode (the handshake's signatures are still checked against
//! the certificate shown, but nothing says whose it is). Trusted when verifying are the
//! platform's roots (`rustls-native-certs`, loaded once per process; `sslrootcert=system`,
//! libpq's name for them, adds none) and the CAs given. tokio-postgres parses neither
//! `sslrootcert` nor the `verify-*` modes: both are taken out of the URL here before it does.
//! Client certificates (`sslcert`, `sslkey`) are not supported.

use std::fmt;
use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use tokio_postgres::Config;
use tower_lease::{Error, Result};

/// The connection string of [`connect`](crate::PgStoreBuilder::connect), parsed.
pub(crate) struct Target {
    /// What tokio-postgres takes.
    pub(crate) config: Config,
    /// `sslrootcert`, a PEM file of CAs to trust (but `system`).
    pub(crate) root_cert: Option<PathBuf>,
    /// Whether the URL asked for the server's certificate to be verified (`verify-ca`,
    /// `verify-full`).
    pub(crate) verify: bool,
}

/// Parses `url` (a URL or libpq's `key=value` form), taking out `sslrootcert` and reading the
/// `verify-*` modes as `require`, which tokio-postgres does not parse. Without the `tls`
/// feature, a URL that requires TLS is refused.
pub(crate) fn parse(url: &str) -> Result<Target> {
    let (rest, root_cert, verify) = rewrite(url);
    let config: Config = rest.parse().map_err(|e| Error::Backend(Box::new(e)))?;
    let require = config.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
    if require && !cfg!(feature = "tls") {
        return Err(Error::Backend(
            "sslmode=require needs tower-lease-postgres's `tls` feature".into(),
        ));
    }
    let root_cert = root_cert.filter(|path| path != "system").map(PathBuf::from);
    Ok(Target {
        config,
        root_cert,
        verify,
    })
}

/// `url` without `sslrootcert`, `sslmode=verify-*` as `sslmode=require`; the path, and
/// whether a `verify-*` mode was asked for.
fn rewrite(url: &str) -> (String, Option<String>, bool) {
    let mut root_cert = None;
    let mut verify = false;
    let mut keep = |key: &str, value: String| match (key, value.as_str()) {
        ("sslrootcert", _) => {
            root_cert = Some(value);
            None
        }
        ("sslmode", "verify-ca" | "verify-full") => {
            verify = true;
            Some("sslmode=require")
        }
        _ => Some(""),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), None, false);
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
            match keep(key, value) {
                Some("") => kept.push(pair),
                Some(replaced) => kept.push(replaced),
                None => {}
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, root_cert, verify);
    }
    let mut rest = String::with_capacity(url.len());
    for (raw, key, value) in pairs(url) {
        match keep(key, value) {
            Some("") => rest.push_str(raw),
            Some(replaced) => rest.push_str(replaced),
            None => continue,
        }
        rest.push(' ');
    }
    (rest, root_cert, verify)
}

/// The `key = value` pairs of libpq's form: each as written, its key, and its value unquoted.
/// What does not parse is left to tokio-postgres, as one pair without a key.
fn pairs(s: &str) -> Vec<(&str, &str, String)> {
    let mut pairs = Vec::new();
    let mut at = 0;
    loop {
        at += s[at..].len() - s[at..].trim_start().len();
        if at == s.len() {
            return pairs;
        }
        let start = at;
        let Some(eq) = s[at..].find('=') else {
            pairs.push((&s[start..], "", String::new()));
            return pairs;
        };
        let key = s[at..at + eq].trim();
        at += eq + 1;
        at += s[at..].len() - s[at..].trim_start().len();
        let quoted = s[at..].starts_with('\'');
        if quoted {
            at += 1;
        }
        let mut value = String::new();
        let mut chars = s[at..].char_indices();
        let mut end = s.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '\'' if quoted => {
                    end = at + i + 1;
                    break;
                }
                c if c.is_whitespace() && !quoted => {
                    end = at + i;
                    break;
                }
                c => value.push(c),
            }
        }
        at = end;
        pairs.push((&s[start..end], key, value));
    }
}

/// What the pool and the listener open their connections with.
#[derive(Clone)]
pub(crate) struct Connector(Inner);

#[cfg(feature = "tls")]
type Inner = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "tls"))]
type Inner = tokio_postgres::NoTls;

impl Connector {
    /// A connector that verifies the server's certificate against the platform's roots, the
    /// builder's PEM certificates and those of the file `root_cert` when the URL asked for it
    /// (`verify`) or CAs were given; that takes any certificate otherwise (libpq's `prefer`
    /// and `require`), or if the builder says so.
    #[cfg(feature = "tls")]
    pub(crate) fn new(
        builder: &crate::PgStoreBuilder,
        root_cert: Option<&std::path::Path>,
        verify: bool,
    ) -> Result<Self> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;

        let mut store = platform_roots().clone();
        let file = match root_cert {
            Some(path) => {
                let from = format!("sslrootcert {}", path.display());
                let pem = std::fs::read(path)
                    .map_err(|e| Error::Backend(format!("{from}: {e}").into()))?;
                Some((pem, from))
            }
            None => None,
        };
        let given = builder
            .root_certificates
            .iter()
            .map(|pem| (pem, "root_certificates".to_owned()));
        for (pem, from) in given.chain(file.iter().map(|(pem, from)| (pem, from.clone()))) {
            let bad = |e: &dyn fmt::Display| Error::Backend(format!("{from}: {e}").into());
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                store.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
                found += 1;
            }
            if found == 0 {
                return Err(bad(
                    &"no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
                ));
            }
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Backend(Box::new(e)))?
            .with_root_certificates(store)
            .with_no_client_auth();
        let verify = verify || root_cert.is_some() || !builder.root_certificates.is_empty();
        if builder.accept_invalid_certificates || !verify {
            let any = std::sync::Arc::new(any::AnyCertificate(provider));
            config.dangerous().set_certificate_verifier(any);
        }
        // What PostgreSQL 17 asks of a direct TLS connection (`sslnegotiation=direct`).
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Connector(Inner::new(config)))
    }

    /// Without the `tls` feature: no TLS, and a URL that asks for it is refused.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn new(
        builder: &crate::PgStoreBuilder,
        root_cert: Option<&std::path::Path>,
        verify: bool,
    ) -> Result<Self> {
        let _ = verify;
        if root_cert.is_some() || !builder.root_certificates.is_empty() {
            return Err(Error::Backend(
                "sslrootcert and root_certificates need tower-lease-postgres's `tls` feature"
                    .into(),
            ));
        }
        Ok(Connector(tokio_postgres::NoTls))
    }

    /// The connector itself, as tokio-postgres takes it.
    #[cfg_attr(not(feature = "tls"), allow(clippy::clone_on_copy))]
    pub(crate) fn make(&self) -> Inner {
        self.0.clone()
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &cfg!(feature = "tls"))
            .finish()
    }
}

/// The platform's roots, loaded once per process; those that do not load are skipped.
#[cfg(feature = "tls")]
fn platform_roots() -> &'static rustls::RootCertStore {
    static ROOTS: std::sync::OnceLock<rustls::RootCertStore> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for e in &loaded.errors {
            tracing::debug!(error = %e, "tower_lease: a platform root did not load");
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(loaded.certs);
        roots
    })
}

/// The verifier of `danger_accept_invalid_certificates`: any certificate, but the
/// handshake's signatures still checked against it.
#[cfg(feature = "tls")]
mod any {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    pub(super) struct AnyCertificate(pub(super) std::sync::Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.0.signature_verification_algorithms;
            verify_tls12_signature(message, cert, dss, algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.0.signature_verification_algorithms;
            verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_and_verify_modes_are_taken_out_of_a_url() {
        let (rest, root, verify) = rewrite(
            "postgres://app@db/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&a=b",
        );
        assert_eq!(rest, "postgres://app@db/app?sslmode=require&a=b");
        assert_eq!(root.as_deref(), Some("/etc/ca x.pem"));
        assert!(verify, "verify-full verifies");
        let (rest, root, verify) = rewrite("postgresql://db/app?sslrootcert=ca.pem");
        assert!(!verify, "no verify-* mode asked for");
        assert_eq!(
            (rest.as_str(), root.as_deref()),
            ("postgresql://db/app", Some("ca.pem"))
        );
        let (rest, root, verify) = rewrite("postgres://db/app?sslmode=prefer");
        assert_eq!(
            (rest.as_str(), root, verify),
            ("postgres://db/app?sslmode=prefer", None, false)
        );
    }

    #[test]
    fn and_out_of_key_value_pairs() {
        let (rest, root, verify) =
            rewrite("host=db sslrootcert = '/etc/my ca\\'s.pem' sslmode=verify-ca user=app");
        assert!(verify, "verify-ca verifies");
        assert_eq!(rest, "host=db sslmode=require user=app ");
        assert_eq!(root.as_deref(), Some("/etc/my ca's.pem"));
        let config = parse("host=db sslmode=verify-full sslrootcert=system").unwrap();
        assert_eq!(
            config.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert!(config.root_cert.is_none());
        assert!(parse("host=db sslmode=sometimes").is_err());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn cas_that_do_not_load_fail_with_where_they_came_from() {
        let builder = crate::PgStoreBuilder::default().root_certificates("not a certificate");
        let e = Connector::new(&builder, None, false).unwrap_err();
        assert!(
            e.to_string()
                .contains("root_certificates: no PEM certificate"),
            "{e}"
        );
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        let e = Connector::new(&Default::default(), Some(missing), false).unwrap_err();
        assert!(
            e.to_string().contains("sslrootcert /nonexistent/ca.pem:"),
            "{e}"
        );
        assert!(Connector::new(&Default::default(), None, true).is_ok());
    }
}
