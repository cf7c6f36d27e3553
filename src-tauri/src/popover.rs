//! The popover: a small undecorated window showing the server's own page (`/`), placed
//! under the tray icon on macOS (where clicks report the icon's position) and at the top
//! right of the screen elsewhere.
use std::sync::Arc;

use tauri::{AppHandle, LogicalSize, Manager, PhysicalPosition, Rect, Runtime, WebviewUrl, WebviewWindow, WebviewWindowBuilder};

use crate::server_slot::ServerSlot;

pub const LABEL: &str = "popover";
const WIDTH: f64 = 380.0;
/// Tall enough for the whole page; shorter screens get a scrolling page.
const HEIGHT: f64 = 820.0;

/// The popover's height on `w`'s monitor: [`HEIGHT`], or what fits under the menu bar.
fn height<R: Runtime>(w: &WebviewWindow<R>) -> f64 {
    match w.current_monitor().ok().flatten().or_else(|| w.primary_monitor().ok().flatten()) {
        Some(m) => (m.size().height as f64 / m.scale_factor() - 72.0).clamp(480.0, HEIGHT),
        None => HEIGHT,
    }
}

fn window<R: Runtime>(app: &AppHandle<R>) -> Option<WebviewWindow<R>> {
    if let Some(w) = app.get_webview_window(LABEL) {
        return Some(w);
    }
    // Before the server is up the page has nothing to show; the tray tooltip says why.
    let url = app.state::<Arc<ServerSlot>>().with(|s| s.url())?;
    let built = WebviewWindowBuilder::new(app, LABEL, WebviewUrl::External(url.parse().ok()?))
        .title("mlxbar")
        .inner_size(WIDTH, HEIGHT)
        .resizable(false)
        .decorations(false)
        .always_on_top(true)
        .skip_taskbar(true)
        .visible(false)
        .build();
    match built {
        Ok(w) => {
            // A popover goes away when focus moves elsewhere (macOS convention).
            #[cfg(target_os = "macos")]
            {
                let hide = w.clone();
                w.on_window_event(move |e| {
                    if let tauri::WindowEvent::Focused(false) = e {
                        let _ = hide.hide();
                    }
                });
            }
            Some(w)
        }
        Err(e) => {
            tracing::error!("popover window: {e}");
            None
        }
    }
}

/// Shows the popover, under `anchor` (the tray icon's rectangle) when known.
pub fn show<R: Runtime>(app: &AppHandle<R>, anchor: Option<Rect>) {
    let Some(w) = window(app) else { return };
    place(&w, anchor);
    let _ = w.show();
    let _ = w.set_focus();
}

pub fn toggle<R: Runtime>(app: &AppHandle<R>, anchor: Option<Rect>) {
    match app.get_webview_window(LABEL) {
        Some(w) if w.is_visible().unwrap_or(false) => {
            let _ = w.hide();
        }
        _ => show(app, anchor),
    }
}

fn place<R: Runtime>(w: &WebviewWindow<R>, anchor: Option<Rect>) {
    let _ = w.set_size(LogicalSize::new(WIDTH, height(w)));
    let scale = w.scale_factor().unwrap_or(1.0);
    let width = (WIDTH * scale) as i32;
    let pos = match anchor {
        Some(rect) => {
            let p = rect.position.to_physical::<i32>(scale);
            let s = rect.size.to_physical::<i32>(scale);
            PhysicalPosition::new(p.x + s.width / 2 - width / 2, p.y + s.height + 4)
        }
        None => match w.primary_monitor().ok().flatten() {
            Some(m) => PhysicalPosition::new(m.position().x + m.size().width as i32 - width - 8, m.position().y + 32),
            None => PhysicalPosition::new(0, 0),
        },
    };
    let _ = w.set_position(pos);
}
