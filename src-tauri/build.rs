//! Tauri's build step (config, capabilities, icons) and MLX linking as for the server.
include!("../build-support/link_mlx.rs");

fn main() {
    println!("cargo:rerun-if-changed=../build-support/link_mlx.rs");
    link_mlx();
    tauri_build::build();
}
