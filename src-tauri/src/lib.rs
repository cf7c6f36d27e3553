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
            // A menu-bar app has no terminal: say it where the user looks.
            let (title, body) = config_error_notice(&e);
            notify::startup_error(&title, &body);
            std::process::exit(2);
        }
    };
    // Rank 0 of a cluster: MLX's ring reads its place from the environment, set while the
    // app has one thread. The other ranks are headless (`mlxbar serve --hostfile F --rank N`).
    if let Some(spec) = &config.cluster {
        if spec.rank > 0 {
            eprintln!(
                "mlxbar-app: the menu-bar app serves rank 0 of a cluster; start rank {} with `mlxbar serve --hostfile FILE --rank {}`",
                spec.rank, spec.rank
            );
            std::process::exit(2);
        }
        // Restarting in place would take the whole app (its window and menu-bar icon) down
        // and up again: the app shows the rank lost and notifies instead.
        if spec.on_lost == mlxbar::distributed::rejoin::OnRankLost::Rejoin {
            eprintln!(
                "mlxbar-app: --on-rank-lost rejoin is for `mlxbar serve`; the app shows a lost rank and notifies (restart it to rejoin)"
            );
            std::process::exit(2);
        }
        if let Err(e) = spec.export_env(&config.data_dir().join("cluster")) {
            eprintln!("mlxbar-app: {e:#}");
            std::process::exit(2);
        }
    }
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

/// The notification for a config that does not load: what and where, on a few lines (a
/// TOML error's drawing of the line is left to stderr; its line and column are kept).
pub fn config_error_notice(e: &anyhow::Error) -> (String, String) {
    let text = format!("{e:#}");
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    let body = match lines.first().and_then(|l| l.split_once("TOML parse error at ")) {
        // "parsing /p/config.toml: TOML parse error at line 3, column 8", the drawing, "invalid type: ..."
        Some((file, at)) => {
            let reason = lines.iter().skip(1).rev().find(|l| !l.trim_start().starts_with(['|', '^']) && !l.contains(" | "));
            let file = file.trim_end().trim_end_matches(':').trim_start_matches("parsing ");
            // An unknown key's message lists every key there is: too long for a notification.
            let reason = reason.map_or("", |r| r.trim());
            let reason = reason.split_once(", expected one of").map_or(reason, |(r, _)| r);
            format!("{file}, {at}: {reason}")
        }
        None => lines.join("\n"),
    };
    ("mlxbar cannot start: the configuration has an error".to_string(), format!("{body}\nFix it and start mlxbar again."))
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_config_error_names_the_file_line_and_reason() {
        let dir = std::env::temp_dir().join(format!("mlxbar-app-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.toml");
        std::fs::write(&path, "port = 8080\nmax_batch = \"eight\"\n").unwrap();
        let err = mlxbar::Config::from_file(&path).unwrap_err();
        let (title, body) = super::config_error_notice(&err);
        assert!(title.contains("cannot start"), "{title}");
        let first = body.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("{}, line 2, column 13: invalid type: string \"eight\", expected usize", path.display())),
            "{body}"
        );
        assert!(body.ends_with("Fix it and start mlxbar again."), "{body}");

        std::fs::write(&path, "prot = 8080\n").unwrap();
        let (_, body) = super::config_error_notice(&mlxbar::Config::from_file(&path).unwrap_err());
        assert!(body.contains("line 1, column 1: unknown field `prot`") && !body.contains("expected one of"), "{body}");
        let (_, body) = super::config_error_notice(&anyhow::anyhow!("max_batch must be between 1 and 256"));
        assert!(body.starts_with("max_batch must be between 1 and 256\n"), "{body}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
