//! A doorbell beside each link of the ring: a plain TCP socket from every rank to the next,
//! on which a rank writes one byte right before it sends MLX a message for the next rank.
//!
//! Why: MLX's ring backend (0.32) waits for a receive by polling a non-blocking socket on
//! its own thread, so a rank sitting in `recv` keeps a core busy (measured here: an idle
//! rank 1 used 68 minutes of CPU in 97). A rank now sleeps in the kernel on its doorbell
//! and posts MLX's receive only once the rank before it is about to send. The doorbell
//! also bounds rank 0's wait for a pass to come back ([`Doorbell::wait`]'s timeout), which
//! MLX's receive cannot.
//!
//! The same sockets carry bad news backwards: a rank whose next rank's socket closes (it
//! died) writes one line naming it to the rank before ([`Doorbell::watch`]), and so on
//! back to rank 0, which can then say which rank it lost even while idle.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::Array;

use super::group::Group;

/// What a rank says when it rings: a message follows on MLX's link.
const RING: u8 = 1;

/// One rank's two doorbell sockets.
pub struct Doorbell {
    /// To the next rank: this rank rings it; the next rank writes bad news back on it.
    next: TcpStream,
    /// From the previous rank: it rings this rank; this rank writes bad news back on it.
    prev: TcpStream,
    /// Set once this rank stops on purpose: a neighbour leaving then is no news.
    leaving: Arc<AtomicBool>,
}

impl Doorbell {
    /// Connects every rank's doorbell to the next rank's, over the ring that `group` has
    /// just joined: each rank listens on an ephemeral port of `ips[rank]`, and the ranks
    /// exchange ports and a random token over MLX (so only a rank of this ring can take a
    /// rank's place on its doorbell). Within `deadline`.
    pub fn connect(group: &Group, ips: &[IpAddr], deadline: Duration) -> Result<Doorbell> {
        let rank = group.rank();
        let until = Instant::now() + deadline;
        // Not this rank's address: a restart would not cure it (the rest may: NotFormed).
        let listener = TcpListener::bind((ips[rank], 0)).with_context(|| format!("listening for the doorbell on {}", ips[rank]))?;
        Self::connect_from(listener, group, ips, until).map_err(super::rejoin::not_formed)
    }

    /// [`Doorbell::connect`] once this rank listens.
    fn connect_from(listener: TcpListener, group: &Group, ips: &[IpAddr], until: Instant) -> Result<Doorbell> {
        let (rank, size) = (group.rank(), group.size());
        let deadline = until.saturating_duration_since(Instant::now());
        let token: [i32; 4] = rand::random();
        let mine = [listener.local_addr()?.port() as i32, token[0], token[1], token[2], token[3]];
        let all = group.all_gather(&Array::from_slice(&mine, &[1, 5]))?;
        all.eval().context("exchanging doorbell ports with the other ranks")?;
        let all = all.as_slice::<i32>();
        let next = (rank + 1) % size;
        let theirs = &all[next * 5..next * 5 + 5];
        let addr = SocketAddr::new(ips[next], theirs[0] as u16);
        let mut out =
            TcpStream::connect_timeout(&addr, deadline).with_context(|| format!("connecting to rank {next}'s doorbell at {addr}"))?;
        out.write_all(&token_bytes(&theirs[1..]))?;
        let prev = accept_token(listener, token_bytes(&token), until)?;
        for s in [&out, &prev] {
            s.set_nodelay(true)?;
        }
        Ok(Doorbell { next: out, prev, leaving: Arc::new(AtomicBool::new(false)) })
    }

    /// Tells the next rank a message follows on MLX's link.
    pub fn ring(&self) -> Result<()> {
        (&self.next).write_all(&[RING]).context("ringing the next rank's doorbell")
    }

    /// Sleeps until the previous rank rings, or `timeout` passes (None: as long as it
    /// takes). An error when its socket closes (it left) or the time is up.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.prev.set_read_timeout(timeout)?;
        let mut byte = [0u8];
        match (&self.prev).read(&mut byte) {
            Ok(1) if byte[0] == RING => Ok(()),
            Ok(0) => bail!("its link closed"),
            Ok(_) => bail!("a stray byte {} on its doorbell", byte[0]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                bail!("no answer within {} s (a rank hung or too slow: --pass-timeout)", timeout.unwrap_or_default().as_secs())
            }
            Err(e) => Err(anyhow!(e).context("its doorbell")),
        }
    }

    /// Shuts both sockets (every clone too): the neighbours read their end closing.
    pub fn close(&self) {
        let _ = self.next.shutdown(std::net::Shutdown::Both);
        let _ = self.prev.shutdown(std::net::Shutdown::Both);
    }

    /// This rank stops on purpose: neighbours leaving from now on is no news.
    pub fn leave(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    /// Watches the next rank: when its socket closes (the rank died) or it sends back a
    /// line of bad news, passes what was lost on to the previous rank and calls `lost`
    /// with it, once, unless this rank is leaving. `name_next` names the next rank
    /// ("rank 2 (host)").
    pub fn watch(&self, name_next: String, lost: impl FnOnce(String) + Send + 'static) -> Result<()> {
        let back = self.next.try_clone()?;
        let mut prev = self.prev.try_clone()?;
        let leaving = self.leaving.clone();
        std::thread::Builder::new().name("mlxbar-ring-watch".into()).spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(back).read_line(&mut line);
            let line = line.trim();
            let what = if line.is_empty() { format!("{name_next}: its link closed") } else { line.to_string() };
            if !leaving.load(Ordering::Relaxed) {
                tell(&mut prev, &what);
                lost(what);
            }
        })?;
        Ok(())
    }

    /// Sends bad news back to the previous rank.
    pub fn tell_prev(&self, what: &str) {
        tell(&mut &self.prev, what);
    }
}

/// One line of news on `to` (best effort: the rank there may be gone too).
fn tell(mut to: impl Write, what: &str) {
    let _ = to.write_all(format!("{}\n", what.replace('\n', " ")).as_bytes());
}

fn token_bytes(t: &[i32]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (chunk, v) in b.chunks_mut(4).zip(t) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The previous rank's connection, the first that presents `token`, before `until`.
/// Accepting blocks, so it runs on a helper thread the deadline abandons.
fn accept_token(listener: TcpListener, token: [u8; 16], until: Instant) -> Result<TcpStream> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("mlxbar-doorbell".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut got = [0u8; 16];
            let ok = conn.set_read_timeout(Some(Duration::from_secs(5))).is_ok() && conn.read_exact(&mut got).is_ok() && got == token;
            if ok && conn.set_read_timeout(None).is_ok() {
                let _ = tx.send(conn);
                return;
            }
        }
    })?;
    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
        .map_err(|_| anyhow!("the previous rank did not ring in on this rank's doorbell in time"))
}
