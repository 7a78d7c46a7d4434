//! Byte accounting: run-wide budgets, per-flow counters, and the wrappers that enforce them on
//! tunnels (an `AsyncRead + AsyncWrite`) and on plain-HTTP bodies (a `hyper::body::Body`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Boxed error used by bodies.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reserves `n` units of `counter` without exceeding `max`.
pub(crate) fn reserve(counter: &AtomicU64, max: u64, n: u64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
            cur.checked_add(n).filter(|t| *t <= max)
        })
        .is_ok()
}

/// Run-wide budgets (shared by every connection of one gateway).
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    pub(crate) max_up: u64,
    pub(crate) max_down: u64,
    /// Set once a reservation failed: from then on the run's budget counts as spent, even if
    /// a few bytes remain below the maximum.
    tripped_up: AtomicBool,
    tripped_down: AtomicBool,
}

impl Budget {
    pub(crate) fn new(max_up: u64, max_down: u64) -> Budget {
        Budget {
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            max_up,
            max_down,
            tripped_up: AtomicBool::new(false),
            tripped_down: AtomicBool::new(false),
        }
    }

    pub(crate) fn exhausted(&self) -> Option<&'static str> {
        if self.tripped_up.load(Ordering::SeqCst) || self.up.load(Ordering::SeqCst) >= self.max_up {
            Some("max_bytes_up")
        } else if self.tripped_down.load(Ordering::SeqCst)
            || self.down.load(Ordering::SeqCst) >= self.max_down
        {
            Some("max_bytes_down")
        } else {
            None
        }
    }
}

/// Counters of one flow (a tunnel or one forwarded request).
#[derive(Debug, Default)]
pub(crate) struct Flow {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    pub(crate) exceeded: Mutex<Option<&'static str>>,
}

impl Flow {
    fn mark(&self, what: &'static str) {
        tracing::debug!(limit = what, "egress byte budget exceeded");
        match self.exceeded.lock() {
            Ok(mut g) => {
                g.get_or_insert(what);
            }
            Err(p) => {
                p.into_inner().get_or_insert(what);
            }
        }
    }

    pub(crate) fn exceeded(&self) -> Option<&'static str> {
        match self.exceeded.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }
}

/// A flow's view of the budget.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub(crate) budget: Arc<Budget>,
    pub(crate) flow: Arc<Flow>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Dir {
    Up,
    Down,
}

impl Meter {
    /// Accounts `n` bytes in direction `dir`; false (and the flow marked) if over budget.
    pub(crate) fn take(&self, dir: Dir, n: u64) -> bool {
        let (global, max, local, name) = match dir {
            Dir::Up => (
                &self.budget.up,
                self.budget.max_up,
                &self.flow.up,
                "max_bytes_up",
            ),
            Dir::Down => (
                &self.budget.down,
                self.budget.max_down,
                &self.flow.down,
                "max_bytes_down",
            ),
        };
        if reserve(global, max, n) {
            local.fetch_add(n, Ordering::SeqCst);
            true
        } else {
            self.trip(dir);
            self.flow.mark(name);
            false
        }
    }

    /// Marks the run-wide budget of `dir` as spent.
    pub(crate) fn trip(&self, dir: Dir) {
        match dir {
            Dir::Up => self.budget.tripped_up.store(true, Ordering::SeqCst),
            Dir::Down => self.budget.tripped_down.store(true, Ordering::SeqCst),
        }
    }

    fn remaining_up(&self) -> u64 {
        self.budget
            .max_up
            .saturating_sub(self.budget.up.load(Ordering::SeqCst))
    }

    fn refund_up(&self, n: u64) {
        let _ = self
            .budget
            .up
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                Some(c.saturating_sub(n))
            });
    }
}

fn limit_error(what: &str) -> io::Error {
    io::Error::other(format!("{what} exceeded"))
}

/// The upstream side of a tunnel: reads are bytes down, writes are bytes up.
pub(crate) struct MeteredStream<S> {
    pub(crate) inner: S,
    pub(crate) meter: Meter,
}

impl<S: AsyncRead + Unpin> AsyncRead for MeteredStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                if n > 0 && !self.meter.take(Dir::Down, n) {
                    // Drop what was read: it must not reach the client.
                    buf.set_filled(before);
                    return Poll::Ready(Err(limit_error("max_bytes_down")));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MeteredStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        let room = self.meter.remaining_up();
        if room == 0 {
            self.meter.trip(Dir::Up);
            self.meter.flow.mark("max_bytes_up");
            return Poll::Ready(Err(limit_error("max_bytes_up")));
        }
        let len = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let want = len as u64;
        if !reserve(&self.meter.budget.up, self.meter.budget.max_up, want) {
            self.meter.trip(Dir::Up);
            self.meter.flow.mark("max_bytes_up");
            return Poll::Ready(Err(limit_error("max_bytes_up")));
        }
        match Pin::new(&mut self.inner).poll_write(cx, &buf[..len]) {
            Poll::Ready(Ok(n)) => {
                let n64 = n as u64;
                self.meter.refund_up(want.saturating_sub(n64));
                self.meter.flow.up.fetch_add(n64, Ordering::SeqCst);
                Poll::Ready(Ok(n))
            }
            other => {
                self.meter.refund_up(want);
                other
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Told when a metered body fails (a malformed chunked body, a connection cut mid-body), so
/// that the failure is recorded.
pub(crate) trait OnBodyError {
    fn body_error(&self, what: &str, e: &BoxError);
    /// The body reached its end cleanly.
    fn body_end(&self) {}
}

/// The request side: a failing request body fails the upstream exchange, which records it.
impl OnBodyError for () {
    fn body_error(&self, _what: &str, _e: &BoxError) {}
}

/// A body whose data frames are accounted in one direction. It may hold a value (the
/// decision recorder) that must live as long as the body.
pub(crate) struct MeteredBody<B, K> {
    pub(crate) inner: B,
    pub(crate) meter: Meter,
    pub(crate) dir: Dir,
    pub(crate) _keep: K,
}

impl<B, K> Body for MeteredBody<B, K>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    K: OnBodyError + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > 0 && !self.meter.take(self.dir, n) {
                        let what = match self.dir {
                            Dir::Up => "max_bytes_up",
                            Dir::Down => "max_bytes_down",
                        };
                        return Poll::Ready(Some(Err(Box::new(limit_error(what)))));
                    }
                }
                if self.inner.is_end_stream() {
                    self._keep.body_end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                let what = match self.dir {
                    Dir::Up => "request body",
                    Dir::Down => "response body",
                };
                self._keep.body_error(what, &e);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self._keep.body_end();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self._keep.body_end();
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_never_exceeds() {
        let c = AtomicU64::new(0);
        assert!(reserve(&c, 10, 6));
        assert!(!reserve(&c, 10, 5));
        assert!(reserve(&c, 10, 4));
        assert!(!reserve(&c, 10, 1));
        assert_eq!(c.load(Ordering::SeqCst), 10);
        let c = AtomicU64::new(u64::MAX - 1);
        assert!(!reserve(&c, u64::MAX, 5));
    }

    #[test]
    fn meter_marks_flow() {
        let m = Meter {
            budget: Arc::new(Budget::new(5, 100)),
            flow: Arc::new(Flow::default()),
        };
        assert!(m.take(Dir::Up, 5));
        assert!(!m.take(Dir::Up, 1));
        assert!(m.take(Dir::Down, 7));
        assert_eq!(m.flow.exceeded(), Some("max_bytes_up"));
        assert_eq!(m.flow.up.load(Ordering::SeqCst), 5);
        assert_eq!(m.flow.down.load(Ordering::SeqCst), 7);
        assert_eq!(m.budget.exhausted(), Some("max_bytes_up"));
    }
}
