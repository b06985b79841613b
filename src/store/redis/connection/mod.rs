//! How a [`RedisStore`](crate::RedisStore) talks to its server: the connections it is built on
//! ([`connect`]), every call kept within the store's timeout ([`timeout`]), `WAIT` for
//! replicas after the writes that make or keep a lease ([`replicas`]), and what the startup
//! check asks the server ([`check`]).

pub(in crate::store::redis) mod check;
pub(in crate::store::redis) mod connect;
pub(in crate::store::redis) mod replicas;
#[cfg(test)]
mod tests;
pub(in crate::store::redis) mod timeout;
