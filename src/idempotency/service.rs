//! [`IdempotencyService`]: reads the key and the body, looks the key up, and answers a retry
//! from the store or hands the first request to [`run`](super::run).

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::HeaderName;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;
use tower_service::Service;

use super::body::IdempotentBody;
use super::config::Config;
use super::future::ResponseFuture;
use super::key;
use super::key::extension::IdempotencyKey;
use super::key::fingerprint::fingerprint;
use super::record::cache::Cached;
use super::record::{self, Record};
use super::reserved::{Reserved, run};
use crate::backend::{Begin, FINGERPRINT_LEN, LeaseRef, LockRef, Mode, Secret};
use crate::layer::extract::ExtractName;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::name::LockName;
use crate::rejection::{BoxError, Reason};
use crate::store::Watch;
use crate::telemetry::{self, IdempotencyOutcome};

/// The request header that carries the key.
pub(crate) static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header a replayed response carries.
static REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The first and the longest pause between two looks of a waiting retry that hears no
/// completions (the memory store, or a subscription that failed).
const FIRST_LOOK: Duration = Duration::from_millis(10);
const LAST_LOOK: Duration = Duration::from_millis(100);
/// The longest pause of a retry that hears completions: a look even if a message was lost.
const WATCHED_LOOK: Duration = Duration::from_secs(1);

/// The service an [`IdempotencyLayer`](super::IdempotencyLayer) makes.
#[derive(Clone)]
pub struct IdempotencyService<S, E> {
    inner: S,
    config: Arc<Config>,
    scope: E,
}

impl<S, E> IdempotencyService<S, E> {
    pub(crate) fn new(inner: S, config: Arc<Config>, scope: E) -> Self {
        Self {
            inner,
            config,
            scope,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, E> fmt::Debug for IdempotencyService<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("namespace", &self.config.idempotency.definition.namespace)
            .finish_non_exhaustive()
    }
}

impl<S, E, B, ResBody> Service<Request<B>> for IdempotencyService<S, E>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: ExtractName<B>,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotentBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone may not be ready; the one `poll_ready` readied goes with the request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let namespace = config.idempotency.definition.namespace;
        let mut keys = req.headers().get_all(&IDEMPOTENCY_KEY).iter();
        let key = match (keys.next(), keys.next()) {
            (None, _) if !config.require_key => {
                let call = inner.call(req);
                return ResponseFuture::new(
                    async move { Ok(call.await?.map(IdempotentBody::inner)) },
                );
            }
            (None, _) => Err(Reason::IdempotencyKeyMissing),
            (Some(value), None) => key::parse(value).ok_or(Reason::IdempotencyKeyInvalid),
            // Two keys name no one request.
            (Some(_), Some(_)) => Err(Reason::IdempotencyKeyInvalid),
        };
        let scope = self.scope.extract(&req);
        let scope = scope.as_ref().map(|scope| scope.lock_name());
        let key = key.and_then(|key| match &scope {
            Some(scope) if scope.len() > crate::MAX_NAME_LEN => Err(Reason::IdempotencyKeyInvalid),
            Some(scope) => Ok((key::name(scope, &key), key)),
            None => Ok((key::name(b"", &key), key)),
        });
        let name = match key {
            Ok((name, key)) => {
                let key_len = key.len();
                let scope = scope.map(|scope| scope.into_owned());
                Named {
                    name,
                    key_len,
                    scope,
                }
            }
            Err(problem) => {
                telemetry::idempotency(namespace, IdempotencyOutcome::InvalidKey);
                let response = config.refuse(problem);
                return ResponseFuture::new(async move { Ok(response) });
            }
        };
        ResponseFuture::new(keyed(inner, config, req, name))
    }
}

/// A request's valid key: its store name, which ends with the key, and the scope for the
/// handler.
struct Named {
    name: Vec<u8>,
    /// The key's length at the end of `name`: copied out only for a request that runs.
    key_len: usize,
    scope: Option<Vec<u8>>,
}

/// The key at the end of `name`, for the handler: printable ASCII, as parsed.
fn key(name: &[u8], key_len: usize) -> String {
    String::from_utf8_lossy(&name[name.len() - key_len..]).into_owned()
}

/// A request with a valid key: its body read, its key looked up, then replayed, refused or run.
async fn keyed<S, B, ResBody>(
    inner: S,
    config: Arc<Config>,
    req: Request<B>,
    named: Named,
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let body = match read_body(&config, body).await {
        Ok(body) => body,
        Err(problem) => return Ok(config.refuse(problem)),
    };
    let fingerprint = fingerprint(&parts, &body, config.fingerprint);
    let definition = config.idempotency.definition;
    let namespace = definition.namespace;
    match config.replays.get(&named.name, &fingerprint) {
        Some(Cached::Replay(record)) => return Ok(replay(&config, record)),
        Some(Cached::Mismatch) => {
            telemetry::idempotency(namespace, IdempotencyOutcome::Mismatch);
            return Ok(config.refuse(Reason::IdempotencyKeyReused));
        }
        None => {}
    }
    // From the first store call on, the request is finished even if the connection is not: a
    // client that goes away mid-call leaves no reservation that nobody runs or frees, as the
    // rest of the call then runs in a task of its own. Until then it runs here, without a task
    // and a channel per request.
    let look = look_up(inner, config.clone(), parts, body, named, fingerprint);
    let look = FinishOnDrop::to_the_end(Box::pin(AssertUnwindSafe(look).catch_unwind()));
    match look.await {
        Ok(answer) => answer,
        // A panic outside the handler (whose panics `run` catches): a bug of the layer or of
        // the store's client. The lease was dropped with it, freeing the key.
        Err(_) => Ok(config.refuse(Reason::StoreUnavailable)),
    }
}

/// Looks `name` up (and again while it is in flight, under `.max_wait`), then replays, refuses or
/// runs the request.
async fn look_up<S, B, ResBody>(
    inner: S,
    config: Arc<Config>,
    parts: http::request::Parts,
    body: Bytes,
    named: Named,
    fingerprint: [u8; FINGERPRINT_LEN],
) -> Result<Response<IdempotentBody<ResBody>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: From<Bytes>,
    ResBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<BoxError>,
{
    let definition = config.idempotency.definition;
    let namespace = definition.namespace;
    let Named {
        name,
        key_len,
        scope,
    } = named;
    let lock = LockRef::new(namespace, &name, definition.ttl);
    let lock = if definition.fenced {
        lock.fenced()
    } else {
        lock
    };
    let secret = Secret::random();
    let deadline = Instant::now() + config.max_wait;
    let mut pause = FIRST_LOOK;
    // Subscribed once the key was found in flight: the completion (or the release of a 5xx)
    // publishes on the key's channel.
    let mut unwatched = config.store.has_notifications();
    let mut watch: Option<Watch> = None;
    loop {
        let sent_at = Instant::now();
        let lease = LeaseRef::new(lock, Mode::Reservation, &secret);
        let once = config.idempotency.at_most_once;
        let begin = config.store.begin(
            lease,
            &fingerprint,
            once.then_some(config.idempotency.retention),
        );
        let begun = match begin.await {
            Ok(begun) => begun,
            Err(error) => {
                tracing::warn!(namespace, %error, "idempotency key look-up failed");
                // A look-up that timed out may still reserve the key: given back.
                config.store.give_back(lease, &error);
                let reason = match error {
                    crate::Error::NotReplicated { .. } => Reason::NotReplicated,
                    _ => Reason::StoreUnavailable,
                };
                return Ok(config.refuse(reason));
            }
        };
        match begun {
            Begin::Reserved { fence } => {
                let req = Request::from_parts(parts, B::from(body));
                let key =
                    IdempotencyKey::new(key(&name, key_len), scope, fence, &config.idempotency);
                let reserved = Reserved {
                    name: std::borrow::Cow::<[u8]>::Owned(name).into(),
                    secret,
                    fence,
                    sent_at,
                    fingerprint,
                    key,
                };
                return run(inner, config, req, reserved).await;
            }
            Begin::InFlight { retry_after } => {
                let now = Instant::now();
                if now >= deadline {
                    telemetry::idempotency(namespace, IdempotencyOutcome::InFlight);
                    return Ok(config.refuse(Reason::IdempotencyInFlight { retry_after }));
                }
                if std::mem::take(&mut unwatched) {
                    let mode = Mode::Reservation;
                    watch = config.store.watch(mode, namespace, &name, deadline).await;
                    // A completion published before a new subscription was not heard: one
                    // more look first.
                    if watch.as_ref().is_some_and(Watch::subscribed_now) {
                        continue;
                    }
                }
                let Some(watch) = &mut watch else {
                    tokio::time::sleep_until((now + pause).min(deadline)).await;
                    pause = (pause * 2).min(LAST_LOOK);
                    continue;
                };
                // The key frees itself at the holder's lease end at the latest.
                let lease_end = now + retry_after + Duration::from_millis(1);
                let until = deadline.min(lease_end).min(now + WATCHED_LOOK);
                tokio::select! {
                    () = watch.released() => {}
                    () = tokio::time::sleep_until(until) => {}
                }
            }
            Begin::Completed {
                response,
                expires_in,
            } => {
                let cache = &config.replays;
                cache.put(&name, fingerprint, response.clone(), sent_at, expires_in);
                return Ok(replay(&config, response));
            }
            Begin::Mismatch => {
                telemetry::idempotency(namespace, IdempotencyOutcome::Mismatch);
                return Ok(config.refuse(Reason::IdempotencyKeyReused));
            }
            Begin::OutcomeUnknown { .. } => {
                telemetry::idempotency(namespace, IdempotencyOutcome::OutcomeUnknown);
                let unknown = Reason::IdempotencyOutcomeUnknown { retry_after: None };
                return Ok(config.refuse(unknown));
            }
        }
    }
}

/// The request body, whole, within the layer's limit and deadline.
async fn read_body<B>(config: &Config, body: B) -> Result<Bytes, Reason>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    // Nothing to read (a `GET`, a `POST` without a body): no reading, no timer.
    if body.is_end_stream() {
        return Ok(Bytes::new());
    }
    let limit = config.max_body;
    // A declared length over the limit is refused before a byte is read.
    if body.size_hint().lower() > limit as u64 {
        return Err(Reason::BodyTooLarge { limit });
    }
    let read = Limited::new(body, limit).collect();
    match tokio::time::timeout(config.body_timeout, read).await {
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(error)) if error.is::<LengthLimitError>() => Err(Reason::BodyTooLarge { limit }),
        Ok(Err(_)) => Err(Reason::BodyUnreadable),
        Err(_) => Err(Reason::BodyTimeout {
            after: config.body_timeout,
        }),
    }
}

/// The stored response, replayed.
fn replay<B>(config: &Config, stored: Bytes) -> Response<IdempotentBody<B>> {
    let namespace = config.idempotency.definition.namespace;
    match record::decode(stored) {
        Some(Record::Response {
            status,
            headers,
            body,
        }) => {
            telemetry::idempotency(namespace, IdempotencyOutcome::Replayed);
            let mut response = Response::new(IdempotentBody::full(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            let replayed = HeaderValue::from_static("true");
            response.headers_mut().insert(REPLAYED.clone(), replayed);
            response
        }
        Some(Record::NotStored { status }) => {
            telemetry::idempotency(namespace, IdempotencyOutcome::Replayed);
            let mut response = config.refuse(Reason::IdempotencyNotStored { status });
            let replayed = HeaderValue::from_static("true");
            response.headers_mut().insert(REPLAYED.clone(), replayed);
            response
        }
        None => {
            tracing::warn!(namespace, "a stored response this version cannot read");
            config.refuse(Reason::StoreUnavailable)
        }
    }
}
