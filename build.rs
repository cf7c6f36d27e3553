//! Links MLX the way our binaries need it (see build-support/link_mlx.rs).
include!("build-support/link_mlx.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build-support/link_mlx.rs");
    link_mlx();
}
