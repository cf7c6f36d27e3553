//! The Ollama port: with `ollama_port` set (off by default; Ollama's own is 11434) the server
//! also answers on 127.0.0.1:<port> — the same router, so the same security, limits and
//! metrics — for Ollama clients that only know Ollama's address. The port being taken
//! (Ollama itself running, say) is no reason to stop serving on the main port: it is logged
//! and shown in `/health` (`ollama_port`), and the server goes on without it.
use std::net::{Ipv4Addr, SocketAddr};

use serde::Serialize;
use tokio::net::TcpListener;

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
}
