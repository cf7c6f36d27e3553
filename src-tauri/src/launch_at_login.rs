//! "Launch at login" in the tray menu, through tauri-plugin-autostart: a Launch Agent on
//! macOS (~/Library/LaunchAgents), an XDG autostart entry on Linux (~/.config/autostart).
//! Off until the user turns it on; the check mark always shows what the system has, read
//! back after each change.
use tauri::menu::CheckMenuItem;
use tauri::{AppHandle, Runtime};
use tauri_plugin_autostart::ManagerExt;

pub const MENU_ID: &str = "launch_at_login";

/// The plugin, registering the app under its product name with no extra arguments (it
/// starts as the user last configured it: config file and defaults).
pub fn plugin<R: Runtime>() -> tauri::plugin::TauriPlugin<R> {
    tauri_plugin_autostart::Builder::new().app_name("mlxbar").build()
}

/// Whether the system starts the app at login now (false when it cannot tell).
pub fn enabled<R: Runtime>(app: &AppHandle<R>) -> bool {
    app.autolaunch().is_enabled().unwrap_or_else(|e| {
        tracing::warn!("reading the launch-at-login setting: {e}");
        false
    })
}

pub fn item<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<CheckMenuItem<R>> {
    CheckMenuItem::with_id(app, MENU_ID, "Launch at login", true, enabled(app), None::<&str>)
}

/// The item was clicked: flips the setting, then shows what the system has.
pub fn toggle<R: Runtime>(app: &AppHandle<R>, item: &CheckMenuItem<R>) {
    let manager = app.autolaunch();
    let changed = if enabled(app) { manager.disable() } else { manager.enable() };
    if let Err(e) = changed {
        crate::notify::show(app, "Launch at login not changed", &e.to_string());
    }
    let _ = item.set_checked(enabled(app));
}
