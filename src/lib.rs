//! mlxbar: an OpenAI-compatible MLX inference server with telemetry, usable headless
//! (`mlxbar serve`) or inside the menu-bar app.
pub mod alerts;
pub mod api;
pub mod bench;
pub mod config;
pub mod distributed;
pub mod doctor;
pub mod engine;
pub mod inference;
pub mod library;
pub mod metrics;
pub mod model_store;
pub mod ollama_port;
pub mod private_fs;
pub mod registry;
pub mod server;
pub mod state_store;
pub mod telemetry;
pub mod transport;

pub use config::Config;
pub use server::Server;
