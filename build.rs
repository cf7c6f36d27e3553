//! Links MLX the way our binaries need it (see build-support/link_mlx.rs) and, on Linux,
//! compiles mlxbar's MLX primitives for the CPU (src/engine/cpu_backend/*/primitive.cpp)
//! against the mlx-cpu wheel's headers.
include!("build-support/link_mlx.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build-support/link_mlx.rs");
    link_mlx();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        compile_primitives();
    }
}

/// mlx-sys's metadata names the wheel's include dir and mlx-c's (for its private handle
/// accessors).
fn compile_primitives() {
    const SRC: &[&str] = &[
        "src/engine/cpu_backend/affine_qmm/primitive.cpp",
        "src/engine/cpu_backend/decode_attention/primitive.cpp",
        "src/engine/cpu_backend/decode_block/primitive.cpp",
        "src/engine/cpu_backend/prefill_attention/primitive.cpp",
        "src/engine/cpu_backend/rope/primitive.cpp",
        "src/engine/cpu_backend/primitive.h",
    ];
    for f in SRC {
        println!("cargo:rerun-if-changed={f}");
    }
    let include = std::env::var("DEP_MLX_INCLUDE").expect("mlx-sys exports its include dirs (scripts/setup.sh)");
    let mut build = cc::Build::new();
    build.cpp(true).std("c++20").files(SRC.iter().filter(|f| f.ends_with(".cpp"))).warnings(false).opt_level(2);
    for dir in std::env::split_paths(&include) {
        build.include(dir);
    }
    build.compile("mlxbar_primitives");
}
