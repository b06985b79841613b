//! The connector the pool and the listener open their connections with: rustls, with the CAs
//! and the client certificate the URL and the builder give.

use std::fmt;

use tower_lease::{Error, Result};

use super::TlsFiles;

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
        files: &TlsFiles,
        verify: bool,
    ) -> Result<Self> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;

        let root_cert = files.root_cert.as_deref();
        let mut store = platform_roots().clone();
        let file = root_cert
            .map(|path| read("sslrootcert", path))
            .transpose()?;
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
        let provider = std::sync::Arc::new(ring_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Backend(Box::new(e)))?
            .with_root_certificates(store);
        let mut config = match client_certificate(builder, files)? {
            Some((chain, key)) => config
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::Backend(format!("client certificate: {e}").into()))?,
            None => config.with_no_client_auth(),
        };
        let verify = verify || root_cert.is_some() || !builder.root_certificates.is_empty();
        if builder.accept_invalid_certificates || !verify {
            let any = std::sync::Arc::new(super::any::AnyCertificate(provider));
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
        files: &TlsFiles,
        verify: bool,
    ) -> Result<Self> {
        let _ = verify;
        if *files != TlsFiles::default()
            || !builder.root_certificates.is_empty()
            || builder.client_certificate.is_some()
        {
            return Err(Error::Backend(
                "sslrootcert, sslcert, root_certificates and client_certificate need \
                 tower-lease-postgres's `tls` feature"
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

/// The PEM file at `path`, named in errors as `what <path>`.
#[cfg(feature = "tls")]
fn read(what: &str, path: &std::path::Path) -> Result<(Vec<u8>, String)> {
    let from = format!("{what} {}", path.display());
    let pem = std::fs::read(path).map_err(|e| Error::Backend(format!("{from}: {e}").into()))?;
    Ok((pem, from))
}

/// The client certificate's chain and key: the URL's files or the builder's, not both.
#[cfg(feature = "tls")]
fn client_certificate(
    builder: &crate::PgStoreBuilder,
    files: &TlsFiles,
) -> Result<
    Option<(
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let ((chain, chain_from), (key, key_from)) = match (
        &files.client_cert,
        &files.client_key,
        &builder.client_certificate,
    ) {
        (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            return Err(Error::Backend(
                "a client certificate both in the URL (sslcert, sslkey) and given to \
                     client_certificate: give one"
                    .into(),
            ));
        }
        (Some(cert), Some(key), None) => (read("sslcert", cert)?, read("sslkey", key)?),
        (None, None, Some((cert, key))) => (
            (cert.clone(), "client_certificate".to_owned()),
            (key.clone(), "client_certificate's key".to_owned()),
        ),
        _ => return Ok(None),
    };
    let bad = |from: &str, e: &dyn fmt::Display| Error::Backend(format!("{from}: {e}").into());
    let chain = CertificateDer::pem_slice_iter(&chain)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&chain_from, &e))?;
    if chain.is_empty() {
        return Err(bad(
            &chain_from,
            &"no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| bad(&key_from, &e))?;
    Ok(Some((chain, key)))
}

/// rustls's provider on *ring*. rustls 0.23.48 deprecates it for its lack of post-quantum key
/// exchange, as a nudge towards aws-lc-rs; *ring* stays, since it builds with a C compiler alone
/// (aws-lc-rs needs CMake and a larger C build), and a connection to PostgreSQL negotiates the
/// same TLS 1.2 and 1.3 suites on it.
#[cfg(feature = "tls")]
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tls")]
    #[test]
    fn cas_that_do_not_load_fail_with_where_they_came_from() {
        let builder = crate::PgStoreBuilder::default().root_certificates("not a certificate");
        let e = Connector::new(&builder, &TlsFiles::default(), false).unwrap_err();
        assert!(
            e.to_string()
                .contains("root_certificates: no PEM certificate"),
            "{e}"
        );
        let missing = TlsFiles {
            root_cert: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = Connector::new(&Default::default(), &missing, false).unwrap_err();
        assert!(
            e.to_string().contains("sslrootcert /nonexistent/ca.pem:"),
            "{e}"
        );
        assert!(Connector::new(&Default::default(), &TlsFiles::default(), true).is_ok());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn client_certificates_that_do_not_load_fail_with_where_they_came_from() {
        let missing = TlsFiles {
            client_cert: Some("/nonexistent/client.crt".into()),
            client_key: Some("/nonexistent/client.key".into()),
            ..TlsFiles::default()
        };
        let e = Connector::new(&Default::default(), &missing, false).unwrap_err();
        assert!(
            e.to_string().contains("sslcert /nonexistent/client.crt:"),
            "{e}"
        );
        let builder = crate::PgStoreBuilder::default().client_certificate("no cert", "no key");
        let e = Connector::new(&builder, &TlsFiles::default(), false).unwrap_err();
        assert!(
            e.to_string()
                .contains("client_certificate: no PEM certificate"),
            "{e}"
        );
        let e = Connector::new(&builder, &missing, false).unwrap_err();
        assert!(e.to_string().contains("give one"), "{e}");
    }
}
