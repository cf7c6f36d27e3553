//! The mlxbar server inside the app: started in the background (the first start may
//! download the default model), shared with the tray, stopped on Quit.
use std::sync::{Arc, Mutex};

use mlxbar::server::ServerStatus;
use mlxbar::{Config, Server};
use tauri::AppHandle;

#[derive(Default)]
enum Slot {
    #[default]
    Starting,
    // Boxed: the server handle is large beside the other states.
    Running(Box<Server>),
    Failed(String),
    Stopped,
}

#[derive(Default)]
pub struct ServerSlot {
    slot: Mutex<Slot>,
}

/// What the app knows about its server.
#[derive(Debug, Clone)]
pub struct AppStatus {
    /// starting | running | failed | stopped
    pub phase: &'static str,
    pub error: Option<String>,
    pub server: Option<ServerStatus>,
}

impl ServerSlot {
    pub fn status(&self) -> AppStatus {
        let slot = self.slot.lock().unwrap();
        let (phase, error, server) = match &*slot {
            Slot::Starting => ("starting", None, None),
            Slot::Running(s) => ("running", None, Some(s.status())),
            Slot::Failed(e) => ("failed", Some(e.clone()), None),
            Slot::Stopped => ("stopped", None, None),
        };
        AppStatus { phase, error, server }
    }

    /// Runs `f` on the server if it is running.
    pub fn with<T>(&self, f: impl FnOnce(&Server) -> T) -> Option<T> {
        match &*self.slot.lock().unwrap() {
            Slot::Running(s) => Some(f(s)),
            _ => None,
        }
    }

    pub fn set_running(&self, server: Server) {
        *self.slot.lock().unwrap() = Slot::Running(Box::new(server));
    }

    pub fn set_failed(&self, error: String) {
        *self.slot.lock().unwrap() = Slot::Failed(error);
    }

    /// Stops the server (running requests end, the socket closes).
    pub async fn stop(&self) {
        let taken = std::mem::replace(&mut *self.slot.lock().unwrap(), Slot::Stopped);
        if let Slot::Running(server) = taken {
            server.shutdown().await;
        }
    }
}

/// Starts the server on the app's async runtime; alert notices then go to notifications.
pub fn start(app: AppHandle, slot: Arc<ServerSlot>, config: Config) {
    tauri::async_runtime::spawn(async move {
        match Server::start(config).await {
            Ok(server) => {
                tracing::info!("serving on {}", server.url());
                crate::notify::forward(app.clone(), server.alerts().subscribe());
                slot.set_running(server);
            }
            Err(e) if e.downcast_ref::<mlxbar::server::PortInUse>().is_some() => {
                // Nothing to show without a server: one line and a non-zero exit, as the CLI does.
                eprintln!("mlxbar-app: {e}");
                crate::notify::show(&app, "mlxbar could not start", &e.to_string());
                app.exit(2);
            }
            Err(e) => {
                let msg = format!("{e:#}");
                tracing::error!("server did not start: {msg}");
                crate::notify::show(&app, "mlxbar could not start its server", &msg);
                slot.set_failed(msg);
            }
        }
    });
}
