fn main() {
    // `sqlx::migrate!` embeds `migrations/` at compile time; without this, adding a migration
    // file would not rebuild the crate (sqlx's documented recommendation).
    println!("cargo:rerun-if-changed=migrations");
    if packed_relocations_run_here() {
        // The binaries' relative relocations packed (DT_RELR): the loader's table shrinks
        // from ~1 MB, read at every start and mapped for the process's life, to a few KB
        // (issue 21 item 2, idle RSS).
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether a binary linked with packed relocations runs where this one is built for: a
/// glibc target built on its own kind of machine with glibc 2.36 or later (the linker marks
/// the binary as needing it; an older glibc refuses to start it). A cross build cannot
/// know its target's glibc, so it is not packed.
fn packed_relocations_run_here() -> bool {
    let var = |k| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("TARGET") != var("HOST")
    {
        return false;
    }
    // `glibc 2.36`
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or("")
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}
