//! What a [`RedisStore`](crate::RedisStore) does differently on a Redis Cluster (feature
//! `cluster`): sharded release notifications ([`sharded`]); the cluster connection itself is made
//! by `connection/connect.rs`.

pub(in crate::store::redis) mod sharded;
