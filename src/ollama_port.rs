//! The Ollama port: with `ollama_port` set (off by default; Ollama's own is 11434) the server
//! also answers on 127.0.0.1:<port> — the same router, so the same security, limits and
//! metrics — for Ollama clients that only know Ollama's address. The port being taken
//! (Ollama itself running, say) is no reason to stop serving on the main port: it is logged
//! and shown in `/health` (`ollama_port`), and the server goes on without it. The menu bar
//! turns it on and off while the server runs ([`Switch`]); that choice is saved and wins
//! over the config's at the next start.
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::state_store::StateStore;
use crate::transport::{self, Limits};

/// The port the menu bar's switch uses when the config names none: Ollama's.
pub const OLLAMA_DEFAULT_PORT: u16 = 11434;

/// What became of the Ollama port.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OllamaPort {
    /// Not configured.
    Off,
    /// Serving here.
    Listening(SocketAddr),
    /// Could not be bound; why.
    Failed(String),
}

/// Binds 127.0.0.1:`port` (0: a free port); a port in use is a clear message, not an error
/// that stops the server.
pub async fn bind(port: u16) -> (OllamaPort, Option<TcpListener>) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpListener::bind(addr).await.and_then(|l| Ok((l.local_addr()?, l))) {
        Ok((bound, listener)) => {
            tracing::info!("also serving the API on http://{bound} (ollama_port)");
            (OllamaPort::Listening(bound), Some(listener))
        }
        Err(e) => {
            let why = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!("port {port} on 127.0.0.1 is already in use (Ollama itself, or another program): mlxbar serves on its main port only; stop the other program or choose another ollama_port")
            } else {
                format!("could not listen on {addr}: {e}")
            };
            tracing::warn!("ollama_port: {why}");
            (OllamaPort::Failed(why), None)
        }
    }
}

/// The Ollama port while the server runs: its state (which `/health` shows) and the
/// listener serving the server's router, started and stopped on demand.
pub struct Switch {
    port: u16,
    status: Arc<Mutex<OllamaPort>>,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    state: Arc<StateStore>,
    running: tokio::sync::Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl Switch {
    /// `port`: where it listens when on; `status` is shared with `/health`.
    pub fn new(
        port: u16,
        status: Arc<Mutex<OllamaPort>>,
        app: Router,
        limits: Limits,
        metrics: Arc<Metrics>,
        state: Arc<StateStore>,
    ) -> Switch {
        Switch { port, status, app, limits, metrics, state, running: tokio::sync::Mutex::new(None) }
    }

    pub fn status(&self) -> OllamaPort {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves on the port (`on`) or stops serving there; what it came to. `save`: the
    /// choice is the user's (the menu bar), kept for the next start.
    pub async fn set(&self, on: bool, save: bool) -> OllamaPort {
        let mut running = self.running.lock().await;
        if let Some((stop, task)) = running.take() {
            let _ = stop.send(());
            // The serve loop drains for at most transport::DRAIN, then ends.
            let _ = task.await;
        }
        let status = match on {
            false => OllamaPort::Off,
            true => match bind(self.port).await {
                (status, Some(listener)) => {
                    let (stop, stopped) = oneshot::channel::<()>();
                    let task = tokio::spawn(transport::serve(listener, self.app.clone(), self.limits, self.metrics.clone(), async {
                        let _ = stopped.await;
                    }));
                    *running = Some((stop, task));
                    status
                }
                (status, None) => status,
            },
        };
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = status.clone();
        if save {
            self.state.update(|s| s.ollama_port = Some(on));
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_a_message_not_a_crash() {
        let (first, held) = bind(0).await;
        let OllamaPort::Listening(addr) = first else { panic!("{first:?}") };
        let (second, listener) = bind(addr.port()).await;
        assert!(listener.is_none());
        let OllamaPort::Failed(why) = second else { panic!("{second:?}") };
        assert!(why.contains(&format!("port {} on 127.0.0.1 is already in use", addr.port())), "{why}");
        drop(held);
    }

    #[tokio::test]
    async fn the_switch_serves_and_stops_and_remembers() {
        let (taken, held) = bind(0).await;
        let OllamaPort::Listening(addr) = taken else { panic!("{taken:?}") };
        let port = addr.port();
        let state = StateStore::in_memory();
        let limits = Limits {
            max_connections: 4,
            header_read_timeout: std::time::Duration::from_secs(5),
            body_read_timeout: std::time::Duration::from_secs(5),
        };
        let status = Arc::new(Mutex::new(OllamaPort::Off));
        let switch = Switch::new(port, status.clone(), Router::new(), limits, Arc::new(Metrics::with_per_request(false)), state.clone());
        assert!(matches!(switch.set(true, true).await, OllamaPort::Failed(_)), "the port is taken");
        drop(held);
        assert_eq!(switch.set(true, true).await, OllamaPort::Listening(addr));
        assert_eq!(*status.lock().unwrap(), OllamaPort::Listening(addr), "/health sees it");
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
        assert_eq!(switch.set(false, true).await, OllamaPort::Off);
        assert_eq!(state.get().ollama_port, Some(false));
        // Off, the port is free again.
        let (again, _listener) = bind(port).await;
        assert_eq!(again, OllamaPort::Listening(addr));
    }
}
