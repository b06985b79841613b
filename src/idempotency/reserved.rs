//! The first request with a key: run under its reservation in a task of its own, its response
//! read (up to the layer's limit) and stored, or the key freed.
//!
//! The task, not the client's connection, owns the work: a client that goes away does not
//! cancel a request that has started. The lease bounds it instead: when the reservation is
//! lost the work is dropped and nothing is stored.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use super::body::IdempotentBody;
use super::config::Config;
use super::key::extension::IdempotencyKey;
use super::record;
use super::record::complete::complete;
use crate::backend::{FINGERPRINT_LEN, Secret};
use crate::coarse_timer::CoarseTimer;
use crate::lease::kept::KeptLease;
use crate::name::owned::OwnedName;
use crate::rejection::{BoxError, Reason};
use crate::store::heartbeat::Heartbeat;
use crate::store::raw::RawLease;
use crate::telemetry::{self, IdempotencyOutcome};

/// A key the store reserved for this request.
pub(crate) struct Reserved {
    pub(crate) name: OwnedName,
    pub(crate) secret: Secret,
    pub(crate) fence: Option<u64>,
    /// When the `idempotency_begin` that reserved it was sent.
    pub(crate) sent_at: Instant,
    pub(crate) fingerprint: [u8; FINGERPRINT_LEN],
    /// The handler's view of the key.
    pub(crate) key: IdempotencyKey,
}

/// How the inner response's body ended while the layer read it.
enum Read<B> {
    /// Within the limit, without trailers: storable.
    Whole,
    /// With trailers, which are not stored.
    Trailers(HeaderMap),
    /// Broken off.
    Failed(BoxError),
    /// Past the limit; the rest follows.
    Over(B),
}

type Answer<B, E> = Result<Response<IdempotentBody<B>>, E>;

/// Runs `req` through `inner` under the reservation `reserved`; called in the request's own
/// task, which the client's connection does not cancel.
pub(crate) async fn run<S, ReqBody, B>(
    mut inner: S,
    config: Arc<Config>,
    mut req: Request<ReqBody>,
    reserved: Reserved,
) -> Answer<B, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let definition = config.idempotency.definition;
    let holding = RawLease::reserved(
        config.store.clone(),
        definition,
        reserved.name,
        reserved.secret,
        reserved.fence,
        reserved.sent_at,
    );
    let own = KeptLease::new(holding, reserved.sent_at, config.timing);
    req.extensions_mut().insert(own.lease());
    req.extensions_mut().insert(reserved.key);
    let call = inner.call(req);
    finish(config, own, call, reserved.fingerprint).await
}

/// The work under the lease, then storing or freeing the key.
async fn finish<F, B, E>(
    config: Arc<Config>,
    own: KeptLease,
    call: F,
    fingerprint: [u8; FINGERPRINT_LEN],
) -> Answer<B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let namespace = config.idempotency.definition.namespace;
    let max = config.max_response;
    let work = async move {
        let (parts, body) = call.await?.into_parts();
        let (data, ending) = read(body, max).await;
        Ok((parts, data, ending))
    };
    let heartbeat = config.store.heartbeat().clone();
    let timer = config.first_beat_timer.clone();
    let done = UnderLease {
        own: Some(own),
        heartbeat,
        timer,
        work,
    }
    .await;
    let (own, done) = done;
    let done = match done {
        Worked::Done(done) => done,
        Worked::Lost => {
            // The work was dropped, and the reservation is someone else's or gone.
            telemetry::idempotency(namespace, IdempotencyOutcome::NotStored);
            drop(own);
            return Ok(config.refuse(Reason::LeaseLost));
        }
        Worked::Panicked => {
            // As a `5xx` of its own: nothing stored. The reservation is released before the
            // answer, so a retry runs at once; an at-most-once key keeps its marker, since
            // the work may have taken effect before it panicked.
            tracing::error!(namespace, "the handler panicked under an idempotency key");
            telemetry::idempotency(namespace, IdempotencyOutcome::NotStored);
            own.release().await;
            return Ok(config.refuse(Reason::HandlerFailed));
        }
    };
    let (parts, data, ending) = match done {
        Ok(done) => done,
        Err(error) => {
            telemetry::idempotency(namespace, IdempotencyOutcome::NotStored);
            own.release().await;
            return Err(error);
        }
    };
    if parts.status.is_server_error() {
        // Never stored: the key is freed before the answer goes out, so the retry runs.
        telemetry::idempotency(namespace, IdempotencyOutcome::NotStored);
        free(&config, own).await;
        return Ok(respond(parts, data, ending));
    }
    let record = match &ending {
        Read::Whole => record::encode(parts.status, &parts.headers, &data),
        _ => record::encode_not_stored(parts.status),
    };
    let whole = matches!(ending, Read::Whole);
    // No response before its record is stored: a `2xx` that a retry could not replay would
    // let that retry run the request again.
    let Err(reason) = complete(&config, own, fingerprint, record).await else {
        let outcome = match whole {
            true => IdempotencyOutcome::Stored,
            false => IdempotencyOutcome::NotStored,
        };
        telemetry::idempotency(namespace, outcome);
        return Ok(respond(parts, data, ending));
    };
    telemetry::idempotency(namespace, IdempotencyOutcome::OutcomeUnknown);
    Ok(config.refuse(reason))
}

/// Frees the key of a response that is not stored, with an at-most-once key's marker.
async fn free(config: &Config, own: KeptLease) {
    if !config.idempotency.at_most_once {
        return own.release().await;
    }
    let state = own.stop();
    let lease = state.holding.lease_ref();
    if let Err(error) = config.store.free(lease).await {
        let namespace = config.idempotency.definition.namespace;
        tracing::warn!(namespace, %error, "freeing the idempotency key failed");
    }
}

/// The first client's response: all of it, whatever was stored.
fn respond<B>(parts: Parts, data: Bytes, ending: Read<B>) -> Response<IdempotentBody<B>> {
    let body = match ending {
        Read::Whole => IdempotentBody::full(data),
        Read::Trailers(trailers) => IdempotentBody::read(data, Some(trailers), None, None),
        Read::Failed(error) => IdempotentBody::read(data, None, Some(error), None),
        Read::Over(rest) => IdempotentBody::read(data, None, None, Some(rest)),
    };
    Response::from_parts(parts, body)
}

/// Reads `body` up to `max` bytes (and the frame that crosses it).
async fn read<B>(mut body: B, max: usize) -> (Bytes, Read<B>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut data = BytesMut::new();
    let mut first: Option<Bytes> = None;
    loop {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => return (joined(first, data), Read::Failed(error.into())),
        };
        let frame = match frame.into_data() {
            Ok(chunk) => {
                let len = first.as_ref().map_or(0, Bytes::len) + data.len() + chunk.len();
                match first.take() {
                    // Most bodies are one chunk: kept as it is, without a copy.
                    None if data.is_empty() => first = Some(chunk),
                    previous => {
                        if let Some(previous) = previous {
                            data.extend_from_slice(&previous);
                        }
                        data.extend_from_slice(&chunk);
                    }
                }
                if len > max {
                    return (joined(first, data), Read::Over(body));
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(trailers) = frame.into_trailers() {
            return (joined(first, data), Read::Trailers(trailers));
        }
    }
    (joined(first, data), Read::Whole)
}

fn joined(first: Option<Bytes>, data: BytesMut) -> Bytes {
    first.unwrap_or_else(|| data.freeze())
}

/// How the work under a reservation ended.
enum Worked<T> {
    /// It finished while the lease was held.
    Done(T),
    /// The lease was lost first, or had run out by the time the work finished.
    Lost,
    /// The handler (or its response body) panicked.
    Panicked,
}

pin_project! {
    /// `work` under the reservation, caught if it panics (the task would otherwise end with
    /// the lease in it, and its client could not be told); the lease comes back either way.
    /// The lease's expiry is checked before every poll of the work, as
    /// [`Held::run`](crate::Held::run) does.
    struct UnderLease<F> {
        own: Option<KeptLease>,
        heartbeat: Heartbeat,
        timer: Arc<CoarseTimer>,
        #[pin]
        work: F,
    }
}

impl<F: Future> Future for UnderLease<F> {
    type Output = (KeptLease, Worked<F::Output>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let own = this
            .own
            .as_mut()
            .expect("UnderLease polled after completion");
        if own.state().over_at(Instant::now()) {
            return Poll::Ready((this.own.take().expect("there"), Worked::Lost));
        }
        // Most requests end before their first beat, and never enrol in the heartbeat.
        own.poll_first_beat(cx, this.heartbeat, this.timer);
        // Unwind-safe as used: after a panic the work is never polled again, only dropped.
        let mut work = this.work;
        let polled = panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Ready(output)) => {
                let own = this.own.take().expect("there");
                let worked = match own.state().over_at(Instant::now()) {
                    true => Worked::Lost,
                    false => Worked::Done(output),
                };
                return Poll::Ready((own, worked));
            }
            Err(_) => return Poll::Ready((this.own.take().expect("there"), Worked::Panicked)),
            Ok(Poll::Pending) => {}
        }
        if own.state().poll_ended(cx).is_ready() {
            return Poll::Ready((this.own.take().expect("there"), Worked::Lost));
        }
        Poll::Pending
    }
}
