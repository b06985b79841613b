//! How the connections of [`connect`](crate::PgStoreBuilder::connect) find a dead peer: TCP
//! keepalives after a few seconds idle, and a bound on data left unacknowledged
//! (`tcp_user_timeout`), each unless the URL sets its own.
//!
//! The pool recycles a connection by asking whether it is closed, not with a query per
//! checkout; a connection whose server vanished (a failover, a host gone, a cut network) is
//! not closed until the kernel finds out, which by its defaults takes two hours idle, or
//! about fifteen minutes of retransmissions. Until then each such pooled connection costs
//! the call that takes it its whole timeout. With these, an idle connection to a dead peer
//! closes within about 10 s (5 s idle, then 3 probes 2 s apart) and is not handed out again,
//! and one with a call on it within 10 s of its last acknowledged data.

use std::time::Duration;

use tokio_postgres::Config;

/// Idle time before the first keepalive probe.
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);
/// Time between probes.
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(2);
/// Probes unanswered before the connection is closed.
const KEEPALIVES_RETRIES: u32 = 3;
/// The longest sent data may stay unacknowledged before the connection is closed.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Turns on the keepalives and the unacknowledged-data bound on `config`, parsed from `url`,
/// but for each setting `url` names (`keepalives=0` turns keepalives off).
pub(crate) fn find_dead_sockets(config: &mut Config, url: &str) {
    if !sets(url, "keepalives") {
        config.keepalives(true);
    }
    if !sets(url, "keepalives_idle") {
        config.keepalives_idle(KEEPALIVES_IDLE);
    }
    if !sets(url, "keepalives_interval") {
        config.keepalives_interval(KEEPALIVES_INTERVAL);
    }
    if !sets(url, "keepalives_retries") {
        config.keepalives_retries(KEEPALIVES_RETRIES);
    }
    if !sets(url, "tcp_user_timeout") {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
}

/// Whether the connection string `url` (a URL's query or the `key=value` form) sets `key`.
fn sets(url: &str, key: &str) -> bool {
    url.match_indices(key).any(|(at, _)| {
        let before = url[..at].chars().next_back();
        let after = url[at + key.len()..].trim_start();
        matches!(before, None | Some('?' | '&' | ' ' | '\t' | '\n')) && after.starts_with('=')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned(url: &str) -> Config {
        let mut config: Config = url.parse().unwrap();
        find_dead_sockets(&mut config, url);
        config
    }

    #[test]
    fn dead_sockets_are_found_within_seconds_by_default() {
        for url in [
            "postgres://app@db/app",
            "host=db user=app dbname=app",
            "postgres://app@db/app?application_name=keepalives_idle",
        ] {
            let config = tuned(url);
            assert!(config.get_keepalives(), "{url}");
            assert_eq!(config.get_keepalives_idle(), KEEPALIVES_IDLE, "{url}");
            assert_eq!(
                config.get_keepalives_interval(),
                Some(KEEPALIVES_INTERVAL),
                "{url}"
            );
            assert_eq!(
                config.get_keepalives_retries(),
                Some(KEEPALIVES_RETRIES),
                "{url}"
            );
            assert_eq!(
                config.get_tcp_user_timeout(),
                Some(&TCP_USER_TIMEOUT),
                "{url}"
            );
        }
    }

    #[test]
    fn what_the_url_sets_it_keeps() {
        let config = tuned(
            "postgres://app@db/app?keepalives_idle=60&keepalives_interval=7\
             &keepalives_retries=9&tcp_user_timeout=30",
        );
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(7))
        );
        assert_eq!(config.get_keepalives_retries(), Some(9));
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(30))
        );
        let config = tuned("host=db user=app keepalives=0 tcp_user_timeout = 4");
        assert!(!config.get_keepalives());
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
        assert_eq!(config.get_keepalives_idle(), KEEPALIVES_IDLE);
    }
}
