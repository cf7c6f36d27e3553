//! The tray icon: its state at a glance (idle, normal, warn, critical, error), a short
//! title while generating, and the menu. Refreshed once a second from the server.
use std::sync::Arc;
use std::time::Duration;

use mlxbar::engine::LoadState;
use mlxbar::ollama_port::OllamaPort;
use mlxbar::telemetry::memory::PressureLevel;
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuBuilder, MenuItem, PredefinedMenuItem};
use tauri::tray::{MouseButton, MouseButtonState, TrayIcon, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, Runtime};
use tauri_plugin_clipboard_manager::ClipboardExt;
use tauri_plugin_opener::OpenerExt;

use crate::model_menu::ModelMenu;
use crate::server_slot::{AppStatus, ServerSlot};

const TRAY_ID: &str = "mlxbar";
/// The menu item that turns the Ollama port (`ollama_port`, else 11434) on and off.
const OLLAMA_PORT: &str = "ollama_port";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrayState {
    /// Starting, loading the model, or paused.
    Idle,
    Normal,
    Warn,
    Critical,
    /// The server or model failed.
    Error,
}

impl TrayState {
    pub fn of(status: &AppStatus) -> TrayState {
        let Some(s) = &status.server else {
            return if status.phase == "failed" { TrayState::Error } else { TrayState::Idle };
        };
        match (&s.state, s.pressure) {
            (LoadState::Failed(_) | LoadState::Stopped, _) => TrayState::Error,
            _ if s.stalled => TrayState::Error,
            (_, PressureLevel::Critical) => TrayState::Critical,
            (_, PressureLevel::Warn) => TrayState::Warn,
            (LoadState::Loading, _) => TrayState::Idle,
            _ if s.paused => TrayState::Idle,
            _ => TrayState::Normal,
        }
    }

    fn icon(self) -> Image<'static> {
        macro_rules! png {
            ($name:literal) => {{
                #[cfg(target_os = "macos")]
                let bytes = include_bytes!(concat!("../../icons/tray/mac/", $name, ".png"));
                #[cfg(not(target_os = "macos"))]
                let bytes = include_bytes!(concat!("../../icons/tray/linux/", $name, ".png"));
                Image::from_bytes(bytes).expect("tray icon png")
            }};
        }
        match self {
            TrayState::Idle => png!("idle"),
            TrayState::Normal => png!("normal"),
            TrayState::Warn => png!("warn"),
            TrayState::Critical => png!("critical"),
            TrayState::Error => png!("error"),
        }
    }

    /// Black-only icons are templates macOS tints for light and dark menu bars; coloured
    /// badges must keep their colour.
    fn is_template(self) -> bool {
        matches!(self, TrayState::Idle | TrayState::Normal)
    }
}

/// The text beside the icon: tok/s while generating, nothing when idle.
pub fn title(status: &AppStatus) -> Option<String> {
    let s = status.server.as_ref()?;
    (s.running > 0 || s.tokens_per_second >= 0.5).then(|| format!("{:.0} tok/s", s.tokens_per_second))
}

/// The tooltip: one line of what is going on.
pub fn tooltip(status: &AppStatus) -> String {
    match (&status.server, &status.error) {
        (_, Some(e)) => format!("mlxbar: {e}"),
        (None, None) => "mlxbar: starting".into(),
        (Some(s), None) => {
            let state = match &s.state {
                LoadState::Loading => "loading the model".to_string(),
                LoadState::Ready if s.stalled => "the engine is stalled (no step with work waiting)".to_string(),
                LoadState::Ready if s.paused => "paused".to_string(),
                LoadState::Ready => format!("serving on {}", s.url),
                LoadState::Failed(e) => format!("model failed: {e}"),
                LoadState::Stopped => "stopped".to_string(),
            };
            let alerts = if s.alerts_firing > 0 { format!(", {} alert(s)", s.alerts_firing) } else { String::new() };
            let bench = if s.bench_running { "; benchmark running" } else { "" };
            format!("mlxbar: {state}; memory pressure {}{alerts}{bench}{}", s.pressure.as_str(), power_text(s))
        }
    }
}

/// The tooltip's GPU, power and thermal figures: each only where this machine reads it (a
/// Mac; Linux has at most watts), the thermal state only when not nominal.
fn power_text(s: &mlxbar::server::ServerStatus) -> String {
    let mut out = String::new();
    if let Some(busy) = s.gpu_busy_ratio {
        out += &format!("; GPU {:.0} %", busy * 100.0);
        if let Some(hz) = s.gpu_frequency_hertz {
            out += &format!(" at {:.2} GHz", hz / 1e9);
        }
    }
    if let Some(w) = s.chip_watts {
        out += &format!("; {w:.1} W");
    }
    match s.thermal {
        Some(t) if t != mlxbar::telemetry::power::ThermalPressure::Nominal => out += &format!("; thermal pressure {}", t.as_str()),
        _ => {}
    }
    out
}

/// The items whose text or state changes after the menu is built.
struct MenuItems<R: Runtime> {
    pause: MenuItem<R>,
    bench: MenuItem<R>,
    models: Arc<ModelMenu<R>>,
    launch_at_login: CheckMenuItem<R>,
    ollama_port: CheckMenuItem<R>,
}

impl<R: Runtime> Clone for MenuItems<R> {
    fn clone(&self) -> Self {
        MenuItems {
            pause: self.pause.clone(),
            bench: self.bench.clone(),
            models: self.models.clone(),
            launch_at_login: self.launch_at_login.clone(),
            ollama_port: self.ollama_port.clone(),
        }
    }
}

fn menu<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<(Menu<R>, MenuItems<R>)> {
    let pause = MenuItem::with_id(app, "pause", "Pause serving", true, None::<&str>)?;
    let bench = MenuItem::with_id(app, "bench", "Run quick benchmark", true, None::<&str>)?;
    let models = ModelMenu::new(app)?;
    let launch_at_login = crate::launch_at_login::item(app)?;
    // Checked once the server says the port serves (see `refresh_loop`).
    let ollama_port = CheckMenuItem::with_id(app, OLLAMA_PORT, "Answer Ollama clients on Ollama's port", true, false, None::<&str>)?;
    let menu = MenuBuilder::new(app)
        .text("show", "Show mlxbar")
        .separator()
        .item(&models.submenu)
        .separator()
        .text("open_dashboard", "Open dashboard in browser")
        .text("copy_metrics_url", "Copy metrics URL")
        .item(&bench)
        .item(&pause)
        .text("reload", "Reload model")
        .item(&ollama_port)
        .item(&PredefinedMenuItem::separator(app)?)
        .item(&launch_at_login)
        .text("quit", "Quit mlxbar")
        .build()?;
    Ok((menu, MenuItems { pause, bench, models, launch_at_login, ollama_port }))
}

pub fn create<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    let (menu, items) = menu(app)?;
    let clicked = items.clone();
    let tray = TrayIconBuilder::with_id(TRAY_ID)
        .icon(TrayState::Idle.icon())
        .icon_as_template(true)
        .tooltip("mlxbar: starting")
        .menu(&menu)
        // macOS: left click toggles the popover, right click opens the menu. Linux tray
        // hosts deliver no clicks, so the menu carries "Show mlxbar".
        .show_menu_on_left_click(false)
        .on_menu_event(move |app, event| on_menu(app, &clicked, event.id().as_ref()))
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click { button: MouseButton::Left, button_state: MouseButtonState::Up, rect, .. } = event {
                crate::popover::toggle(tray.app_handle(), Some(rect));
            }
        })
        .build(app)?;
    refresh_loop(app.clone(), tray, items);
    Ok(())
}

fn on_menu<R: Runtime>(app: &AppHandle<R>, items: &MenuItems<R>, id: &str) {
    if items.models.on_click(app, id) {
        return;
    }
    let slot = app.state::<Arc<ServerSlot>>();
    let url = slot.with(|s| s.url());
    match id {
        "show" => crate::popover::show(app, None),
        "open_dashboard" => {
            if let Some(url) = url {
                if let Err(e) = app.opener().open_url(format!("{url}/"), None::<&str>) {
                    tracing::warn!("opening the dashboard: {e}");
                }
            }
        }
        "copy_metrics_url" => {
            if let Some(url) = url {
                if let Err(e) = app.clipboard().write_text(format!("{url}/metrics")) {
                    tracing::warn!("copying the metrics URL: {e}");
                }
            }
        }
        "bench" => {
            // Starts the quick profile; the popover shows its progress and results, and a
            // notification says how it ended (whoever started it may have looked away).
            if let Some(bench) = slot.with(|s| s.bench().clone()) {
                let notifier = app.clone();
                tauri::async_runtime::spawn(async move {
                    match bench.start("quick") {
                        Ok(job) => {
                            let (title, body) = job.ended().await.notice();
                            crate::notify::show(&notifier, &title, &body);
                        }
                        Err(e) => tracing::warn!("starting the benchmark: {e}"),
                    }
                });
                crate::popover::show(app, None);
            }
        }
        "reload" => {
            // Back from a failed load, a dead or stalled engine: a fresh engine thread
            // loads the model; a notification says how it went.
            if let Some(models) = slot.with(|s| s.models().clone()) {
                let notifier = app.clone();
                tauri::async_runtime::spawn(async move {
                    let id = models.default_id().to_string();
                    let (title, body) = match models.reload(&id).await {
                        Ok(()) => ("Model reloaded".to_string(), format!("{id} is serving again")),
                        Err(e) => ("The model failed to load".to_string(), e.to_string()),
                    };
                    crate::notify::show(&notifier, &title, &body);
                });
            }
        }
        "pause" => {
            // Toggles: while paused, generation requests get 503.
            slot.with(|s| s.set_paused(!s.is_paused()));
        }
        OLLAMA_PORT => {
            // Flips the second address for Ollama clients; the check mark shows what came of
            // it, and a port already taken (Ollama itself) is a notification.
            if let Some(switch) = slot.with(|s| s.ollama_port().clone()) {
                let (notifier, item) = (app.clone(), items.ollama_port.clone());
                tauri::async_runtime::spawn(async move {
                    let on = !matches!(switch.status(), OllamaPort::Listening(_));
                    let status = switch.set(on, true).await;
                    let _ = item.set_checked(matches!(status, OllamaPort::Listening(_)));
                    if let OllamaPort::Failed(why) = status {
                        crate::notify::show(&notifier, "The Ollama port is not served", &why);
                    }
                });
            }
        }
        crate::launch_at_login::MENU_ID => crate::launch_at_login::toggle(app, &items.launch_at_login),
        "quit" => {
            // RunEvent::Exit stops the server.
            app.exit(0);
        }
        _ => {}
    }
}

/// Updates icon, title, tooltip, the pause, bench and Ollama port items and the model
/// submenu when they change.
fn refresh_loop<R: Runtime>(app: AppHandle<R>, tray: TrayIcon<R>, items: MenuItems<R>) {
    tauri::async_runtime::spawn(async move {
        let mut shown: Option<(TrayState, Option<String>, String, bool, bool)> = None;
        let mut ollama_shown: Option<bool> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let slot = app.state::<Arc<ServerSlot>>();
            if let Some(list) = slot.with(|s| s.models().list()) {
                if let Err(e) = items.models.refresh(&app, crate::model_menu::rows(&list)) {
                    tracing::warn!("tray model menu: {e}");
                }
            }
            let serving_ollama = slot.with(|s| matches!(s.ollama_port().status(), OllamaPort::Listening(_)));
            if serving_ollama.is_some() && serving_ollama != ollama_shown {
                let _ = items.ollama_port.set_checked(serving_ollama == Some(true));
                ollama_shown = serving_ollama;
            }
            let status = slot.status();
            let paused = status.server.as_ref().is_some_and(|s| s.paused);
            let benching = status.server.as_ref().is_some_and(|s| s.bench_running);
            let now = (TrayState::of(&status), title(&status), tooltip(&status), paused, benching);
            if shown.as_ref() == Some(&now) {
                continue;
            }
            let (state, title, tip, paused, benching) = now.clone();
            if shown.as_ref().map(|s| s.0) != Some(state) {
                let _ = tray.set_icon(Some(state.icon()));
                let _ = tray.set_icon_as_template(state.is_template());
            }
            let _ = tray.set_title(title.as_deref());
            let _ = tray.set_tooltip(Some(tip));
            let _ = items.pause.set_text(if paused { "Resume serving" } else { "Pause serving" });
            let _ = items.bench.set_text(if benching { "Benchmark running…" } else { "Run quick benchmark" });
            let _ = items.bench.set_enabled(!benching && !paused);
            shown = Some(now);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlxbar::server::ServerStatus;

    fn status(state: LoadState, pressure: PressureLevel, paused: bool, running: usize, tps: f64) -> AppStatus {
        AppStatus {
            phase: "running",
            error: None,
            server: Some(ServerStatus {
                url: "http://127.0.0.1:8080".into(),
                state,
                paused,
                pressure,
                tokens_per_second: tps,
                running,
                waiting: 0,
                alerts_firing: 0,
                bench_running: false,
                stalled: false,
                gpu_busy_ratio: None,
                gpu_frequency_hertz: None,
                chip_watts: None,
                thermal: None,
            }),
        }
    }

    #[test]
    fn icon_state_follows_server_and_pressure() {
        use PressureLevel::*;
        assert_eq!(TrayState::of(&AppStatus { phase: "starting", error: None, server: None }), TrayState::Idle);
        assert_eq!(TrayState::of(&AppStatus { phase: "failed", error: Some("port in use".into()), server: None }), TrayState::Error);
        assert_eq!(TrayState::of(&status(LoadState::Ready, Normal, false, 0, 0.0)), TrayState::Normal);
        assert_eq!(TrayState::of(&status(LoadState::Ready, Unknown, false, 0, 0.0)), TrayState::Normal);
        assert_eq!(TrayState::of(&status(LoadState::Ready, Warn, false, 0, 0.0)), TrayState::Warn);
        assert_eq!(TrayState::of(&status(LoadState::Loading, Critical, false, 0, 0.0)), TrayState::Critical, "pressure outranks loading");
        assert_eq!(TrayState::of(&status(LoadState::Ready, Normal, true, 0, 0.0)), TrayState::Idle);
        assert_eq!(TrayState::of(&status(LoadState::Failed("bad file".into()), Normal, false, 0, 0.0)), TrayState::Error);
    }

    #[test]
    fn title_shows_throughput_only_while_generating() {
        assert_eq!(title(&status(LoadState::Ready, PressureLevel::Normal, false, 0, 0.0)), None);
        assert_eq!(title(&status(LoadState::Ready, PressureLevel::Normal, false, 1, 23.4)), Some("23 tok/s".into()));
        assert!(tooltip(&status(LoadState::Ready, PressureLevel::Warn, true, 0, 0.0)).contains("paused"));
    }

    /// GPU, watts and a thermal state beyond nominal in the tooltip where readable (values as
    /// macmon reports an M-series GPU under load); nothing of them where not (this Linux box).
    #[test]
    fn tooltip_adds_gpu_power_and_thermal_where_readable() {
        let mut s = status(LoadState::Ready, PressureLevel::Normal, false, 1, 20.0);
        let plain = tooltip(&s);
        assert!(!plain.contains("GPU") && !plain.contains(" W") && !plain.contains("thermal"), "{plain}");
        let server = s.server.as_mut().unwrap();
        server.gpu_busy_ratio = Some(0.87);
        server.gpu_frequency_hertz = Some(1.296e9);
        server.chip_watts = Some(14.26);
        server.thermal = Some(mlxbar::telemetry::power::ThermalPressure::Nominal);
        assert!(tooltip(&s).ends_with("; GPU 87 % at 1.30 GHz; 14.3 W"), "{}", tooltip(&s));
        s.server.as_mut().unwrap().thermal = Some(mlxbar::telemetry::power::ThermalPressure::Serious);
        assert!(tooltip(&s).ends_with("; 14.3 W; thermal pressure serious"), "{}", tooltip(&s));
    }
}
