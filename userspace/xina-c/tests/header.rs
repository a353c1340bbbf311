//! `include/xina.h` is what cbindgen makes of `src/lib.rs`, and a C
//! compiler takes it: a C program that uses every declaration compiles and
//! links against the library.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_committed_header_is_what_cbindgen_makes_of_the_source() {
    let config = cbindgen::Config::from_file(crate_dir().join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir())
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut made);
    let path = crate_dir().join("include/xina.h");
    if std::env::var_os("XINA_BLESS").is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let committed = std::fs::read(&path).unwrap();
    assert!(
        committed == made,
        "include/xina.h differs from what cbindgen makes of src/lib.rs; regenerate it with \
         XINA_BLESS=1 cargo test -p xina-c --test header"
    );
}

/// The directory cargo put this crate's libraries in (the test binary sits
/// in its `deps`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

#[test]
fn a_c_program_compiles_against_the_header_and_links() {
    let out = std::env::temp_dir().join(format!("xina-c-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join("uses_every_call");
    let lib = lib_dir();
    assert!(
        lib.join("libxina_c.so").exists() || lib.join("deps/libxina_c.so").exists(),
        "libxina_c.so not built next to {}",
        lib.display()
    );
    let status = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(crate_dir().join("tests/uses_every_call.c"))
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-L")
        .arg(lib.join("deps"))
        .arg("-lxina_c")
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "cc failed");
    // It runs: the calls it makes fail cleanly without a switch.
    let run = Command::new(&exe)
        .env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", lib.display(), lib.join("deps").display()),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("XINA_SWITCH: not set"), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}
