fn main() {
    // `sqlx::migrate!` embeds `migrations/` at compile time; without this, adding a migration
    // file would not rebuild the crate (sqlx's documented recommendation).
    println!("cargo:rerun-if-changed=migrations");
    // The binaries' relative relocations packed (DT_RELR, glibc 2.36+, GNU ld 2.38+): the
    // loader's table shrinks from ~1 MB, resident for the process's life once read at
    // start, to a few KB (issue 21 item 2, idle RSS).
    let var = |k| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
