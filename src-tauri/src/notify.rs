//! Alert notices from the server's alert engine, and how a bench run from the tray ended,
//! become native notifications (Notification Center on macOS, org.freedesktop.Notifications
//! over D-Bus on Linux).
use mlxbar::alerts::Notice;
use tauri::{AppHandle, Runtime};
use tokio::sync::broadcast::{error::RecvError, Receiver};

#[cfg(feature = "notifications")]
pub fn show<R: Runtime>(app: &AppHandle<R>, title: &str, body: &str) {
    use tauri_plugin_notification::NotificationExt;
    if let Err(e) = app.notification().builder().title(title).body(body).show() {
        tracing::warn!("notification not shown: {e}");
    }
}

/// Built without notifications (see Cargo.toml): the notice goes to the log only.
#[cfg(not(feature = "notifications"))]
pub fn show<R: Runtime>(_app: &AppHandle<R>, title: &str, body: &str) {
    tracing::warn!("{title}: {body}");
}

/// Says why the app cannot start (a broken config.toml) where a menu-bar app's user looks:
/// a notification that stays until dismissed, sent before tauri runs (the app then exits).
/// The reason goes to stderr as well, by the caller.
#[cfg(feature = "notifications")]
pub fn startup_error(title: &str, body: &str) {
    let shown = notify_rust::Notification::new().appname("mlxbar").summary(title).body(body).timeout(notify_rust::Timeout::Never).show();
    if let Err(e) = shown {
        tracing::warn!("notification not shown: {e}");
    }
}

#[cfg(not(feature = "notifications"))]
pub fn startup_error(_title: &str, _body: &str) {}

/// Shows every notice from `rx` until the server stops.
pub fn forward<R: Runtime>(app: AppHandle<R>, mut rx: Receiver<Notice>) {
    tauri::async_runtime::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(n) => show(&app, &n.title, &n.body),
                Err(RecvError::Lagged(missed)) => tracing::warn!("{missed} alert notices dropped"),
                Err(RecvError::Closed) => return,
            }
        }
    });
}
