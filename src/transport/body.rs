//! The bodies around each request and response: [`Upload`] gives a request's body one
//! deadline for the whole of it (a client that trickles a byte a second cannot hold a
//! connection: a per-read timeout would never fire) and tells the connection table when
//! the body is in; [`Reply`] tells it when the response is done.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::slots::Conn;

/// The request body did not arrive within `body_read_timeout_seconds`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimeout(pub Duration);

/// The [`BodyTimeout`] behind `err`, if that is what it is: the JSON extractor answers 408.
pub fn timed_out(err: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<BodyTimeout>() {
            return Some(t.0);
        }
        cur = e.source();
    }
    None
}

pub struct Upload {
    inner: hyper::body::Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    conn: Arc<Conn>,
    done: bool,
}

impl Upload {
    /// The deadline runs from now (the request's head has arrived).
    pub fn new(inner: hyper::body::Incoming, limit: Duration, conn: Arc<Conn>) -> Upload {
        Upload { inner, deadline: Box::pin(tokio::time::sleep(limit)), limit, conn, done: false }
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.conn.body_done();
        }
    }
}

impl HttpBody for Upload {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.finish();
                    Poll::Ready(Some(Err(BodyTimeout(this.limit).into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A response body that marks its request done when hyper has sent it (or dropped it).
pub struct Reply {
    inner: Body,
    conn: Arc<Conn>,
}

impl Reply {
    pub fn new(inner: Body, conn: Arc<Conn>) -> Reply {
        Reply { inner, conn }
    }
}

impl HttpBody for Reply {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.conn.request_done();
    }
}
