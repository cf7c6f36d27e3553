//! The tray's "Model" submenu: every runnable local model (loaded ones checked, with the
//! memory they hold), a click loads one (a notification says when it is ready, or why the
//! server refused), and an "Unload <id>" item per loaded model. Kept in step with the
//! server's registry by the tray's once-a-second refresh.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mlxbar::registry::{ModelView, Models, SlotState};
use tauri::menu::{CheckMenuItem, IsMenuItem, MenuItem, PredefinedMenuItem, Submenu};
use tauri::{AppHandle, Manager, Runtime};

use crate::server_slot::ServerSlot;

const LOAD: &str = "model:load:";
const UNLOAD: &str = "model:unload:";

/// What one model's line shows.
#[derive(Debug, Clone, PartialEq)]
pub enum RowState {
    Unloaded,
    /// Fraction done, when the loader reports it.
    Loading(Option<f64>),
    /// Memory held (weights and KV budget), when known.
    Loaded(Option<u64>),
    /// Draining its requests before it unloads.
    Unloading,
    Failed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub state: RowState,
}

impl Row {
    /// The menu's line for a model the engine can run; none for the others.
    pub fn of(m: &ModelView) -> Option<Row> {
        if !m.entry.runnable {
            return None;
        }
        let state = match m.state {
            SlotState::Unloaded => RowState::Unloaded,
            SlotState::Loading => RowState::Loading(m.progress),
            SlotState::Loaded => RowState::Loaded(m.memory_bytes),
            SlotState::Unloading => RowState::Unloading,
            SlotState::Failed => RowState::Failed,
        };
        Some(Row { id: m.entry.id.clone(), state })
    }

    pub fn loaded(&self) -> bool {
        matches!(self.state, RowState::Loaded(_))
    }

    /// Loading or unloading: a click could only queue behind it.
    fn busy(&self) -> bool {
        matches!(self.state, RowState::Loading(_) | RowState::Unloading)
    }

    /// "SmolLM2-135M-Instruct — 540 MB", "… — loading 40%", "… — failed".
    pub fn label(&self) -> String {
        match &self.state {
            RowState::Unloaded => self.id.clone(),
            RowState::Loaded(Some(b)) => format!("{} — {}", self.id, fmt_bytes(*b)),
            RowState::Loaded(None) => self.id.clone(),
            RowState::Loading(Some(p)) => format!("{} — loading {:.0}%", self.id, p * 100.0),
            RowState::Loading(None) => format!("{} — loading…", self.id),
            RowState::Unloading => format!("{} — unloading…", self.id),
            RowState::Failed => format!("{} — failed to load", self.id),
        }
    }
}

/// The runnable models in a stable order (by id), so lines do not jump when one loads.
pub fn rows(list: &[ModelView]) -> Vec<Row> {
    let mut rows: Vec<Row> = list.iter().filter_map(Row::of).collect();
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    rows
}

/// Binary units, as the popover shows them: "540 MB", "1.2 GB".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 || i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// What the submenu holds now: one check item per model, then the unload items.
struct Shown<R: Runtime> {
    rows: Vec<Row>,
    checks: Vec<(String, CheckMenuItem<R>)>,
}

pub struct ModelMenu<R: Runtime> {
    pub submenu: Submenu<R>,
    shown: Mutex<Option<Shown<R>>>,
    /// A click toggled a check mark that the next refresh must put back.
    clicked: AtomicBool,
}

impl<R: Runtime> ModelMenu<R> {
    pub fn new(app: &AppHandle<R>) -> tauri::Result<Arc<ModelMenu<R>>> {
        let submenu = Submenu::with_id(app, "model", "Model", true)?;
        // Until the server is up there is nothing to list.
        submenu.append(&MenuItem::with_id(app, "model:none", "Starting…", false, None::<&str>)?)?;
        Ok(Arc::new(ModelMenu { submenu, shown: Mutex::new(None), clicked: AtomicBool::new(false) }))
    }

    /// Brings the submenu in line with `rows`: texts and checks updated in place when the
    /// same models are listed and the same ones loaded (an open menu stays open), rebuilt
    /// otherwise.
    pub fn refresh(&self, app: &AppHandle<R>, rows: Vec<Row>) -> tauri::Result<()> {
        let mut shown = self.shown.lock().unwrap();
        let clicked = self.clicked.swap(false, Ordering::Relaxed);
        if let Some(s) = shown.as_ref() {
            if s.rows == rows && !clicked {
                return Ok(());
            }
            let same_shape = s.rows.len() == rows.len() && s.rows.iter().zip(&rows).all(|(a, b)| a.id == b.id && a.loaded() == b.loaded());
            if same_shape {
                for ((_, item), row) in s.checks.iter().zip(&rows) {
                    item.set_text(row.label())?;
                    item.set_checked(row.loaded())?;
                    item.set_enabled(!row.busy())?;
                }
                shown.as_mut().unwrap().rows = rows;
                return Ok(());
            }
        }
        for item in self.submenu.items()? {
            self.submenu.remove(&item)?;
        }
        let mut checks = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = format!("{LOAD}{}", row.id);
            let item = CheckMenuItem::with_id(app, id, row.label(), !row.busy(), row.loaded(), None::<&str>)?;
            self.submenu.append(&item)?;
            checks.push((row.id.clone(), item));
        }
        if rows.is_empty() {
            self.submenu.append(&MenuItem::with_id(app, "model:none", "No runnable local models", false, None::<&str>)?)?;
        }
        let loaded: Vec<&Row> = rows.iter().filter(|r| r.loaded()).collect();
        if !loaded.is_empty() {
            self.submenu.append(&PredefinedMenuItem::separator(app)?)?;
            for row in loaded {
                let item = MenuItem::with_id(app, format!("{UNLOAD}{}", row.id), format!("Unload {}", row.id), true, None::<&str>)?;
                self.submenu.append(&item as &dyn IsMenuItem<R>)?;
            }
        }
        tracing::debug!(models = ?rows.iter().map(Row::label).collect::<Vec<_>>(), "tray model menu");
        *shown = Some(Shown { rows, checks });
        Ok(())
    }

    /// A check item toggles itself when clicked; put back what the server says until the
    /// next refresh shows the outcome. Runs on the main thread, which a refresh holding
    /// the lock may be waiting for: then that refresh's successor does it.
    fn restore_check(&self, id: &str) {
        self.clicked.store(true, Ordering::Relaxed);
        let Ok(shown) = self.shown.try_lock() else { return };
        if let Some(s) = shown.as_ref() {
            if let (Some((_, item)), Some(row)) = (s.checks.iter().find(|(i, _)| i == id), s.rows.iter().find(|r| r.id == id)) {
                let _ = item.set_checked(row.loaded());
            }
        }
    }

    /// Handles a click on one of the submenu's items; false when `menu_id` is not one.
    pub fn on_click(&self, app: &AppHandle<R>, menu_id: &str) -> bool {
        let Some(models) = app.state::<Arc<ServerSlot>>().with(|s| s.models().clone()) else {
            return menu_id.starts_with("model:");
        };
        if let Some(id) = menu_id.strip_prefix(LOAD) {
            self.restore_check(id);
            load(app.clone(), models, id.to_string());
            true
        } else if let Some(id) = menu_id.strip_prefix(UNLOAD) {
            unload(app.clone(), models, id.to_string());
            true
        } else {
            menu_id.starts_with("model:")
        }
    }
}

/// Loads `id`; a notification says when it serves, or why it was refused (the server's
/// own words: "X needs ~5.1 GB; 3.2 GB is available without swapping").
fn load<R: Runtime>(app: AppHandle<R>, models: Arc<Models>, id: String) {
    let already = models.list().iter().any(|m| m.entry.id == id && m.state == SlotState::Loaded);
    if already {
        return;
    }
    tauri::async_runtime::spawn(async move {
        match models.load(&id).await {
            Ok(()) => {
                let memory = models.list().into_iter().find(|m| m.entry.id == id).and_then(|m| m.memory_bytes);
                let body = match memory {
                    Some(b) => format!("{id} is loaded ({}) and serving", fmt_bytes(b)),
                    None => format!("{id} is loaded and serving"),
                };
                crate::notify::show(&app, "Model ready", &body);
            }
            Err(e) => crate::notify::show(&app, &format!("{id} was not loaded"), &e.to_string()),
        }
    });
}

fn unload<R: Runtime>(app: AppHandle<R>, models: Arc<Models>, id: String) {
    tauri::async_runtime::spawn(async move {
        if let Err(e) = models.unload(&id).await {
            crate::notify::show(&app, &format!("{id} was not unloaded"), &e.to_string());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_say_the_state_and_the_memory() {
        let row = |state| Row { id: "SmolLM2".into(), state };
        assert_eq!(row(RowState::Unloaded).label(), "SmolLM2");
        assert_eq!(row(RowState::Loaded(Some(540 * 1024 * 1024))).label(), "SmolLM2 — 540 MB");
        assert_eq!(row(RowState::Loaded(Some(3 * 1024 * 1024 * 1024 / 2))).label(), "SmolLM2 — 1.5 GB");
        assert_eq!(row(RowState::Loading(Some(0.42))).label(), "SmolLM2 — loading 42%");
        assert_eq!(row(RowState::Loading(None)).label(), "SmolLM2 — loading…");
        assert!(row(RowState::Failed).label().contains("failed"));
        assert_eq!(row(RowState::Unloading).label(), "SmolLM2 — unloading…");
        assert!(row(RowState::Loaded(None)).loaded() && !row(RowState::Loading(None)).loaded());
    }

    #[test]
    fn bytes_read_as_the_popover_shows_them() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(90 * 1024 * 1024 + 300 * 1024), "90.3 MB");
        assert_eq!(fmt_bytes(5 * 1024 * 1024 * 1024), "5.0 GB");
    }
}
