//! The HTTP server's socket side: our own accept loop over hyper (axum's `serve` installs no
//! timer and no cap). A request's head must arrive within `header_read_timeout_seconds`
//! (also the idle limit of a keep-alive connection), its body within
//! `body_read_timeout_seconds` (408), and at most `max_connections` sockets are served at
//! once ([`slots`]: past it a connection that only waits on its client gives way, else the
//! newcomer gets a 503 and is closed). Descriptors stay bounded however many clients
//! connect, so model loads never meet EMFILE. Stopping drains: no new connections, idle
//! ones close, requests in flight finish (for at most [`DRAIN`]).
pub mod body;
pub mod nofile;
pub mod slots;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::api::error::ApiError;
use crate::metrics::Metrics;
use body::{Reply, Upload};
use slots::{Admission, Slots};

/// Refused connections being answered at once; past it one is closed without a word (each
/// holds a descriptor for up to [`REFUSAL_TIME`]).
pub const REFUSING: usize = 16;
/// How long a refused connection may take to read its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(2);
/// A connection gives way to a newcomer only after waiting this long on its client.
pub const EVICT_AFTER: Duration = Duration::from_millis(100);
/// A newcomer that finds every place taken waits this long for one (a connection ending, or
/// one waiting on its client for [`EVICT_AFTER`]) before it gets the 503.
const ADMIT_WAIT: Duration = Duration::from_secs(1);
/// Stopping waits this long for requests in flight (their engines have stopped by then),
/// then closes what is left.
pub const DRAIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
}

impl Limits {
    pub fn from_config(c: &crate::Config) -> Limits {
        Limits {
            max_connections: c.max_connections,
            header_read_timeout: Duration::from_secs_f64(c.header_read_timeout_seconds),
            body_read_timeout: Duration::from_secs_f64(c.body_read_timeout_seconds),
        }
    }
}

/// Serves `app` on `listener` until `stop` resolves, then drains.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, metrics: Arc<Metrics>, stop: impl Future<Output = ()>) {
    let slots = Slots::new(limits.max_connections);
    for reason in ["evicted", "refused"] {
        metrics.http_connections_shed_total.with_label_values(&[reason]);
    }
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (something besides connections holds them):
                    // accepting again at once would spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Full: look again every few milliseconds, at most ADMIT_WAIT (places free up as
        // answers go out and waiting connections ripen).
        let admit_by = tokio::time::Instant::now() + ADMIT_WAIT;
        let mut admission = slots.admit(EVICT_AFTER);
        let mut stopped = false;
        while matches!(admission, Admission::Full) && tokio::time::Instant::now() < admit_by {
            tokio::select! {
                biased;
                _ = &mut stop => {
                    stopped = true;
                    break;
                }
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            admission = slots.admit(EVICT_AFTER);
        }
        if stopped {
            break;
        }
        match admission {
            Admission::Admitted { ticket, evicted } => {
                if evicted {
                    metrics.http_connections_shed_total.with_label_values(&["evicted"]).inc();
                }
                let conn = ticket.conn.clone();
                let app = app.clone();
                let timeout = limits.body_read_timeout;
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let conn = conn.clone();
                    conn.request_started(!http_body::Body::is_end_stream(req.body()));
                    let req = req.map(|b| Body::new(Upload::new(b, timeout, conn.clone())));
                    let answer = app.clone().oneshot(req);
                    async move {
                        let resp = answer.await.unwrap_or_else(|never| match never {});
                        Ok::<_, Infallible>(resp.map(|b| Reply::new(b, conn)))
                    }
                });
                let served = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                let gauge = Gauge::new(metrics.http_connections.clone());
                tokio::spawn(async move {
                    let evict = ticket.conn.evict.clone();
                    tokio::select! {
                        r = served => if let Err(e) = r {
                            tracing::debug!("connection: {e}");
                        },
                        _ = evict.cancelled() => {}
                    }
                    drop((ticket, gauge));
                });
            }
            Admission::Full => {
                metrics.http_connections_shed_total.with_label_values(&["refused"]).inc();
                refuse(stream, &refusing);
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open {DRAIN:?} after stopping; closing them");
    }
}

/// Answers 503 and closes, in a task of its own (or closes at once if too many are being
/// answered already).
fn refuse(mut stream: TcpStream, refusing: &Arc<Semaphore>) {
    let Ok(permit) = refusing.clone().try_acquire_owned() else { return };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            stream.write_all(&refusal()).await?;
            stream.shutdown().await?;
            // Read what the client sends until it closes: closing with its request unread
            // would reset the connection, and the client might lose the answer.
            let mut buf = [0u8; 4096];
            while stream.read(&mut buf).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// The whole 503 answer, in our error shape.
fn refusal() -> Vec<u8> {
    let e = ApiError::too_many_connections();
    let body = e.body().to_string();
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: {}\r\nconnection: close\r\n\r\n",
        body.len(),
        e.retry_after_secs.unwrap_or(1)
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `mlxbar_http_connections` counts a connection while its task lives.
struct Gauge(prometheus::IntGauge);

impl Gauge {
    fn new(g: prometheus::IntGauge) -> Gauge {
        g.inc();
        Gauge(g)
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}
