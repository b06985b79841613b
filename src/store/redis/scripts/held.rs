//! The scripts' way of extending and releasing a held lease: every lease on a server without
//! native compare-and-set (see `native/`), and readers and permits everywhere.

use redis::aio::ConnectionLike;

use crate::Result;
use crate::backend::{Extended, LeaseRef, Mode};
use crate::store::redis::extend_many::{extend_keys, extended};
use crate::store::redis::scripts::call::{Call, LastArg};
use crate::store::redis::scripts::{Holder, holder_script};
use crate::store::redis::{RedisStore, answered_one, notify};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Extends `lease` with its script: every lease on a server without native
    /// compare-and-set, and readers and permits everywhere.
    pub(in crate::store::redis) async fn extend_script(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<Extended> {
        let (script, _) = holder_script(lease.mode, Holder::Extend);
        let call = Call {
            script,
            lock: lease.lock,
            roles: extend_keys(lease.mode),
            fence: None,
            secret: Some(lease.secret),
            last: LastArg::Ttl,
        };
        let (reply, waited) = self.run_waiting(call, self.replicas).await?;
        let extended = extended(reply)?;
        if let (Some(replicas), Some(waited)) = (self.replicas, waited) {
            // A lease found gone wrote nothing to wait for.
            if extended != Extended::Gone {
                replicas.check(waited)?;
            }
        }
        Ok(extended)
    }

    /// Releases `lease` with its script, as [`extend_script`](Self::extend_script) extends;
    /// `live` when its holder confirmed a reader or a permit live until after now (see
    /// [`Backend::release_live`](crate::backend::Backend::release_live)).
    pub(in crate::store::redis) async fn release_script(
        &self,
        lease: LeaseRef<'_>,
        live: bool,
    ) -> Result<bool> {
        let (script, role) = holder_script(lease.mode, Holder::Release);
        let (lock, secret) = (lease.lock, Some(lease.secret));
        // A reader's or a permit's script names its channel from its key.
        let channel = match lease.mode {
            Mode::Read | Mode::Permit => Vec::new(),
            _ => notify::channel(self.layout(), lease.mode, lock.namespace, lock.name),
        };
        let last = match lease.mode {
            Mode::Read | Mode::Permit if live => LastArg::Live,
            Mode::Read | Mode::Permit => LastArg::None,
            _ => LastArg::Channel(&channel),
        };
        answered_one(self.run(script, lock, &[role], None, secret, last).await?)
    }
}
