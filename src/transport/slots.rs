//! The connection table: at most `max_connections` sockets are served at once. When it is
//! full, a new connection takes the place of the one that has waited longest on its client
//! (for a request's head, the rest of its body, or the next request of a keep-alive
//! connection): such a socket costs a descriptor and nothing else, so idle and trickling
//! clients can never crowd out `/health` or a model load. When every connection is busy
//! with work the server does (a handler running, a response being sent), the new one is
//! refused with a 503. Only a connection that has waited at least a moment gives way: one
//! just accepted has had no time to send its request (a burst of clients must not close
//! each other's connections before their requests are read).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

pub struct Slots {
    max: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    conns: HashMap<u64, Arc<Conn>>,
}

/// What [`Slots::admit`] decided for a new connection.
pub enum Admission {
    /// Served; `evicted` says whether another connection was closed to make room.
    Admitted { ticket: Ticket, evicted: bool },
    /// Every slot is busy with server work.
    Full,
}

impl Slots {
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots { max: max.max(1), table: Mutex::new(Table::default()) })
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.lock().conns.len()
    }

    /// A place for a new connection; `ripe`: how long a connection must have waited on its
    /// client to give way.
    pub fn admit(self: &Arc<Self>, ripe: Duration) -> Admission {
        let mut table = self.lock();
        let mut evicted = false;
        if table.conns.len() >= self.max {
            let now = Instant::now();
            let victim = table
                .conns
                .values()
                .filter_map(|c| c.waiting_since().filter(|since| now.duration_since(*since) >= ripe).map(|since| (since, c.id)))
                .min();
            let Some((_, id)) = victim else { return Admission::Full };
            if let Some(conn) = table.conns.remove(&id) {
                conn.evict.cancel();
            }
            evicted = true;
        }
        let id = table.next_id;
        table.next_id += 1;
        let conn = Arc::new(Conn::new(id));
        table.conns.insert(id, conn.clone());
        Admission::Admitted { ticket: Ticket { conn, slots: self.clone() }, evicted }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection's place in the table; dropping it (the connection's task ends) frees it.
pub struct Ticket {
    pub conn: Arc<Conn>,
    slots: Arc<Slots>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.slots.lock().conns.remove(&self.conn.id);
    }
}

/// One connection as the table sees it: whether it waits on its client, since when, and
/// the signal that closes it.
pub struct Conn {
    id: u64,
    state: Mutex<State>,
    /// Cancelled when the table gives this connection's place to a newer one.
    pub evict: CancellationToken,
}

struct State {
    /// A request is being handled (from its head to the end of its response).
    in_request: bool,
    /// The request's body is still coming from the client.
    reading_body: bool,
    /// When the connection last started waiting on its client.
    since: Instant,
}

impl Conn {
    fn new(id: u64) -> Conn {
        Conn {
            id,
            state: Mutex::new(State { in_request: false, reading_body: false, since: Instant::now() }),
            evict: CancellationToken::new(),
        }
    }

    /// Since when it waits on its client; None while the server works for it.
    pub fn waiting_since(&self) -> Option<Instant> {
        let s = self.lock();
        (!s.in_request || s.reading_body).then_some(s.since)
    }

    /// A request's head arrived; `body` says whether a body is still to come.
    pub fn request_started(&self, body: bool) {
        let mut s = self.lock();
        (s.in_request, s.reading_body, s.since) = (true, body, Instant::now());
    }

    /// The request's body has been read (or dropped).
    pub fn body_done(&self) {
        self.lock().reading_body = false;
    }

    /// The response has been sent (or abandoned): the connection waits for the next request.
    pub fn request_done(&self) {
        let mut s = self.lock();
        (s.in_request, s.reading_body, s.since) = (false, false, Instant::now());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(a: Admission) -> (Ticket, bool) {
        match a {
            Admission::Admitted { ticket, evicted } => (ticket, evicted),
            Admission::Full => panic!("refused"),
        }
    }

    #[test]
    fn a_full_table_evicts_the_longest_waiting_client_and_refuses_when_all_are_busy() {
        let slots = Slots::new(3);
        let (a, _) = ticket(slots.admit(Duration::ZERO));
        let (b, _) = ticket(slots.admit(Duration::ZERO));
        let (c, _) = ticket(slots.admit(Duration::ZERO));
        // a: busy with a request; b: waiting for its body since before c started waiting.
        a.conn.request_started(false);
        b.conn.request_started(true);
        c.conn.request_done();
        let (d, evicted) = ticket(slots.admit(Duration::ZERO));
        assert!(evicted && b.conn.evict.is_cancelled() && !c.conn.evict.is_cancelled() && !a.conn.evict.is_cancelled());
        assert_eq!(slots.held(), 3);
        // b's task ends later: its ticket does not remove anyone else.
        drop(b);
        assert_eq!(slots.held(), 3);
        for t in [&c, &d] {
            t.conn.request_started(true);
            t.conn.body_done();
        }
        assert!(matches!(slots.admit(Duration::ZERO), Admission::Full), "every connection is busy");
        d.conn.request_done();
        let (_e, evicted) = ticket(slots.admit(Duration::ZERO));
        assert!(evicted && d.conn.evict.is_cancelled());
        // A connection that has only just started waiting does not give way yet.
        assert!(matches!(slots.admit(Duration::from_secs(60)), Admission::Full), "nobody has waited a minute");
        drop((a, c));
        assert_eq!(slots.held(), 1);
    }
}
