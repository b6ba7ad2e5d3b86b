//! The open-file limit of a serving process. Every client connection, upstream connection
//! and database file is a descriptor, and distributions start processes with a soft limit
//! of 1024 under a far higher hard one: 500 concurrent streams (a client socket and an
//! upstream socket each) would run out. Like nginx (`worker_rlimit_nofile`) and redis
//! (`maxclients`), the gateway raises its soft limit to the hard one at start.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs both; a failure is logged
/// and the process goes on with the limit it has.
pub fn raise() {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own; no other precondition.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read the open-file limit");
            return;
        }
        let before = lim.rlim_cur;
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the
            // hard one needs no privilege.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
                tracing::warn!(error = %std::io::Error::last_os_error(), soft = before,
                    "cannot raise the open-file limit");
                return;
            }
        }
        tracing::info!(
            soft = lim.rlim_cur,
            hard = lim.rlim_max,
            was = before,
            "open-file limit"
        );
    }
}
