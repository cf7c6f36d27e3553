//! The app's commands: what the tray menu does, callable over IPC too.
use std::sync::Arc;

use tauri::State;

use crate::server_slot::{AppStatus, ServerSlot};

#[tauri::command]
pub fn app_status(slot: State<'_, Arc<ServerSlot>>) -> AppStatus {
    slot.status()
}

/// Pauses (`serving: false`) or resumes serving: while paused, generation requests get 503.
#[tauri::command]
pub fn set_serving(slot: State<'_, Arc<ServerSlot>>, serving: bool) -> Result<AppStatus, String> {
    slot.with(|s| s.set_paused(!serving)).ok_or_else(|| format!("the server is not running ({})", slot.status().phase))?;
    Ok(slot.status())
}
