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

use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use tokio_postgres::Config;
use tower_lease::{Error, Result};

#[cfg(feature = "tls")]
mod any;
mod connector;

pub(crate) use connector::Connector;

/// The connection string of [`connect`](crate::PgStoreBuilder::connect), parsed.
pub(crate) struct Target {
    /// What tokio-postgres takes.
    pub(crate) config: Config,
    /// The files the URL names.
    pub(crate) files: TlsFiles,
    /// Whether the URL asked for the server's certificate to be verified (`verify-ca`,
    /// `verify-full`).
    pub(crate) verify: bool,
}

/// The files a URL names for TLS, read when the store connects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// `sslrootcert`: a PEM file of CAs to trust (but `system`).
    pub(crate) root_cert: Option<PathBuf>,
    /// `sslcert`: the client's certificate, with its chain, in PEM.
    pub(crate) client_cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key, in PEM.
    pub(crate) client_key: Option<PathBuf>,
}

/// Parses `url` (a URL or libpq's `key=value` form), taking out the TLS files and reading the
/// `verify-*` modes as `require` and `allow` as `prefer`, which tokio-postgres does not parse.
/// Without the `tls` feature, a URL that requires TLS is refused.
pub(crate) fn parse(url: &str) -> Result<Target> {
    let Rewritten {
        rest,
        root_cert,
        client_cert,
        client_key,
        verify,
    } = rewrite(url);
    let config: Config = rest.parse().map_err(|e| Error::Backend(Box::new(e)))?;
    let require = config.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
    if require && !cfg!(feature = "tls") {
        return Err(Error::Backend(
            "sslmode=require needs tower-lease-postgres's `tls` feature".into(),
        ));
    }
    if client_cert.is_some() != client_key.is_some() {
        return Err(Error::Backend(
            "a client certificate needs both sslcert and sslkey in the URL".into(),
        ));
    }
    let files = TlsFiles {
        root_cert: root_cert.filter(|path| path != "system").map(PathBuf::from),
        client_cert: client_cert.map(PathBuf::from),
        client_key: client_key.map(PathBuf::from),
    };
    Ok(Target {
        config,
        files,
        verify,
    })
}

/// A URL with what tokio-postgres does not parse taken out or replaced.
#[derive(Debug, Default, PartialEq, Eq)]
struct Rewritten {
    /// What tokio-postgres takes.
    rest: String,
    root_cert: Option<String>,
    client_cert: Option<String>,
    client_key: Option<String>,
    /// Whether a `verify-*` mode was asked for.
    verify: bool,
}

/// `url` without `sslrootcert`, `sslcert` and `sslkey`, `sslmode=verify-*` as
/// `sslmode=require` and `sslmode=allow` as `sslmode=prefer`.
fn rewrite(url: &str) -> Rewritten {
    let mut taken = Rewritten::default();
    let mut keep = |key: &str, value: String| match (key, value.as_str()) {
        ("sslrootcert", _) => {
            taken.root_cert = Some(value);
            None
        }
        ("sslcert", _) => {
            taken.client_cert = Some(value);
            None
        }
        ("sslkey", _) => {
            taken.client_key = Some(value);
            None
        }
        ("sslmode", "verify-ca" | "verify-full") => {
            taken.verify = true;
            Some("sslmode=require")
        }
        ("sslmode", "allow") => Some("sslmode=prefer"),
        _ => Some(""),
    };
    let mut rest = String::with_capacity(url.len());
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            taken.rest = url.to_owned();
            return taken;
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
        rest.push_str(base);
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
    } else {
        for (raw, key, value) in pairs(url) {
            match keep(key, value) {
                Some("") => rest.push_str(raw),
                Some(replaced) => rest.push_str(replaced),
                None => continue,
            }
            rest.push(' ');
        }
    }
    taken.rest = rest;
    taken
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_and_verify_modes_are_taken_out_of_a_url() {
        let taken = rewrite(
            "postgres://app@db/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&a=b",
        );
        assert_eq!(taken.rest, "postgres://app@db/app?sslmode=require&a=b");
        assert_eq!(taken.root_cert.as_deref(), Some("/etc/ca x.pem"));
        assert!(taken.verify, "verify-full verifies");
        let taken = rewrite("postgresql://db/app?sslrootcert=ca.pem");
        assert!(!taken.verify, "no verify-* mode asked for");
        assert_eq!(
            (taken.rest.as_str(), taken.root_cert.as_deref()),
            ("postgresql://db/app", Some("ca.pem"))
        );
        let taken = rewrite("postgres://db/app?sslmode=prefer");
        assert_eq!(
            taken,
            Rewritten {
                rest: "postgres://db/app?sslmode=prefer".to_owned(),
                ..Rewritten::default()
            }
        );
    }

    #[test]
    fn client_certificates_and_allow_are_taken_out_of_a_url() {
        let taken = rewrite("postgres://db/app?sslcert=%2Fc.crt&sslmode=allow&sslkey=k.key");
        assert_eq!(taken.rest, "postgres://db/app?sslmode=prefer");
        assert_eq!(taken.client_cert.as_deref(), Some("/c.crt"));
        assert_eq!(taken.client_key.as_deref(), Some("k.key"));
        let taken = rewrite("host=db sslcert=c.crt sslkey='my key.pem' sslmode=allow");
        assert_eq!(taken.rest, "host=db sslmode=prefer ");
        assert_eq!(taken.client_key.as_deref(), Some("my key.pem"));
        let alone = parse("postgres://db/app?sslcert=c.crt")
            .err()
            .map(|e| e.to_string());
        assert!(
            alone
                .as_deref()
                .is_some_and(|e| e.contains("both sslcert and sslkey")),
            "{alone:?}"
        );
    }

    #[test]
    fn and_out_of_key_value_pairs() {
        let taken =
            rewrite("host=db sslrootcert = '/etc/my ca\\'s.pem' sslmode=verify-ca user=app");
        assert!(taken.verify, "verify-ca verifies");
        assert_eq!(taken.rest, "host=db sslmode=require user=app ");
        assert_eq!(taken.root_cert.as_deref(), Some("/etc/my ca's.pem"));
        let config = parse("host=db sslmode=verify-full sslrootcert=system").unwrap();
        assert_eq!(
            config.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert!(config.files.root_cert.is_none());
        assert!(parse("host=db sslmode=sometimes").is_err());
    }
}
