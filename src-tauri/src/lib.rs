//! The menu-bar app: starts the mlxbar server in this process, shows its state in a tray
//! icon, the popover page in a small webview, and alert notices as native notifications.
//!
//! - `server_slot.rs`: the in-process server and its lifecycle (starting, running, failed)
//! - `tray.rs`:        icon, title and menu, refreshed once a second
//! - `model_menu.rs`:  the menu's "Model" submenu: load, switch and unload local models
//! - `launch_at_login.rs`: the menu's "Launch at login" (tauri-plugin-autostart)
//! - `popover.rs`:     the popover window
//! - `notify.rs`:      alert notices (and the tray's bench results) → native notifications
pub mod launch_at_login;
pub mod model_menu;
pub mod notify;
pub mod popover;
pub mod server_slot;
pub mod tray;

use std::sync::Arc;

use clap::Parser;
use tauri::{Manager, RunEvent};
use tracing_subscriber::EnvFilter;

pub use server_slot::{AppStatus, ServerSlot};

#[derive(Debug, Parser)]
#[command(name = "mlxbar-app", version, about = "mlxbar in the menu bar: the MLX server, its live metrics and alerts")]
pub struct Args {
    #[command(flatten)]
    pub serve: mlxbar::config::ServeArgs,
}

pub fn run() {
    fix_c_locale();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("MLXBAR_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = match mlxbar::Config::load(&args.serve) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mlxbar-app: {e:#}");
            std::process::exit(2);
        }
    };
    let slot = Arc::new(ServerSlot::default());
    let app = builder(tauri::Builder::default(), slot.clone())
        .setup(move |app| {
            #[cfg(target_os = "macos")]
            app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            tray::create(app.handle())?;
            server_slot::start(app.handle().clone(), slot.clone(), config.clone());
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("building the tauri app");
    app.run(|app, event| match event {
        // Closing the popover must not end a menu-bar app; only Quit does (code Some).
        RunEvent::ExitRequested { code: None, api, .. } => api.prevent_exit(),
        RunEvent::Exit => {
            let slot = app.state::<Arc<ServerSlot>>();
            tauri::async_runtime::block_on(slot.stop());
        }
        _ => {}
    });
}

/// Under the C/POSIX locale WebKitGTK reports `navigator.language` as "C", which is not a
/// language tag: `Intl` (and so the popover's chart) throws. Desktop sessions set a real
/// locale; bare ones (ssh, CI, some launchers) do not, so fall back to en_US there.
fn fix_c_locale() {
    #[cfg(target_os = "linux")]
    {
        let effective = ["LC_ALL", "LC_MESSAGES", "LANG"].iter().find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        let is_c = effective.as_deref().is_none_or(|v| v == "C" || v == "POSIX" || v.starts_with("C."));
        if is_c {
            // Before any other thread exists (first thing in `run`).
            std::env::remove_var("LC_ALL");
            std::env::set_var("LANG", "en_US.UTF-8");
        }
    }
}

/// `base` with the app's plugins and state, but no tray or windows. The popover page gets
/// no IPC commands: it talks to the in-process server over HTTP like any client.
pub fn builder<R: tauri::Runtime>(base: tauri::Builder<R>, slot: Arc<ServerSlot>) -> tauri::Builder<R> {
    #[cfg(feature = "notifications")]
    let base = base.plugin(tauri_plugin_notification::init());
    base.plugin(tauri_plugin_opener::init()).plugin(tauri_plugin_clipboard_manager::init()).plugin(launch_at_login::plugin()).manage(slot)
}
