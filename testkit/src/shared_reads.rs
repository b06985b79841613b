//! Write intents heard across stores: reads that keep overlapping through an `RwLockLayer` on
//! one store (the [`Env`]'s second store, standing for another process; without one, the store
//! under test) share one reader lease; a writer that waits on the other store leaves its write
//! intent, which the backend delivers
//! ([`NotificationSink::write_intent`](tower_lease::backend::NotificationSink::write_intent)),
//! so the shared reads take no new reader, and the writer gets in once the reads in flight
//! end, not at the share's next heartbeat (which reports the intent too, but [`BEAT`] later).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::{Instant, sleep};
use tower_layer::Layer;
use tower_lease::{RwLock, RwLockLayer, extract};
use tower_service::Service;

use crate::Env;
use crate::wakeups::WAKE;

/// Long enough that the share's heartbeat (every [`BEAT`]) is not what closes it.
const TTL: Duration = Duration::from_secs(6);
/// The share's heartbeat, whose extension reports a write intent too: a store that does not
/// deliver intents has its writer wait up to this long.
pub const BEAT: Duration = Duration::from_secs(2);
/// How long each read request takes.
pub const READ: Duration = Duration::from_millis(100);
/// The default policy, whose waiting writers leave intents.
const CATALOG: RwLock<str> = RwLock::new("shared-reads", TTL);

/// A read handler: counts itself inside for [`READ`].
#[derive(Clone)]
struct Reading {
    inside: Arc<AtomicUsize>,
}

impl<B> Service<Request<B>> for Reading {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        let inside = self.inside.clone();
        Box::pin(async move {
            let (_inside, _) = crate::Inside::enter(&inside);
            sleep(READ).await;
            Ok(Response::new("read".to_owned()))
        })
    }
}

/// Four clients keep reads overlapping through an `RwLockLayer` on one store (sharing one
/// reader lease); 300 ms in, a writer waits on the other store. It gets in within the reads in
/// flight ([`READ`]) and [`WAKE`] where the reading store has notifications (or is the
/// writer's own), within the share's heartbeat ([`BEAT`]) more otherwise; no read is inside
/// when it does.
pub async fn a_writer_elsewhere_closes_the_shared_reads_promptly(env: Env) {
    let writing = env.store.clone();
    let reading = env.elsewhere().unwrap_or_else(|| writing.clone());
    let heard_at_once = env.elsewhere().is_none() || reading.has_notifications();
    let inside = Arc::new(AtomicUsize::new(0));
    let layer = RwLockLayer::new(reading, CATALOG, extract::path_segment(1))
        .max_wait(Duration::from_secs(3))
        .heartbeat(BEAT);
    let service = layer.layer(Reading {
        inside: inside.clone(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for i in 0..4u32 {
        let (mut service, stop, served) = (service.clone(), stop.clone(), served.clone());
        clients.push(tokio::spawn(async move {
            sleep(READ / 4 * i).await;
            while !stop.load(Ordering::SeqCst) {
                std::future::poll_fn(|cx| Service::<Request<String>>::poll_ready(&mut service, cx))
                    .await
                    .unwrap();
                let request = Request::get("/docs/1").body(String::new()).unwrap();
                let response = service.call(request).await.unwrap();
                match response.status() {
                    StatusCode::OK => served.fetch_add(1, Ordering::SeqCst),
                    // Refused (busy or a store error): not a hot loop.
                    _ => {
                        sleep(Duration::from_millis(20)).await;
                        0
                    }
                };
            }
        }));
    }
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let writer = CATALOG
        .try_write_for(&writing, "1", Duration::from_secs(4))
        .await
        .unwrap();
    let took = started.elapsed();
    let readers_inside = inside.load(Ordering::SeqCst);
    let writer = writer.expect("the writer got in among the shared reads");
    sleep(Duration::from_millis(20)).await;
    assert!(writer.release().await.unwrap(), "released while held");
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(
        readers_inside, 0,
        "a read was inside when the writer got in"
    );
    assert!(
        served.load(Ordering::SeqCst) >= 4,
        "reads were served: {}",
        served.load(Ordering::SeqCst)
    );
    let bound = match heard_at_once {
        true => READ + WAKE,
        false => BEAT + READ + WAKE,
    };
    assert!(
        took <= bound,
        "the writer got in after {took:?}, more than {bound:?}: the shared reads took new \
         readers (the write intent was not delivered to the reading store)"
    );
}
