//! What the gateway itself ran out of when an outbound call failed (`local_shortage`): an
//! OS error number down the error's `source()` chain.

/// What the gateway itself ran out of, when an outbound call failed for want of a local
/// resource rather than anything the far side did. The cause is an `io::Error` somewhere
/// down the `source()` chain: reqwest wraps hyper-util's `ConnectError` ("tcp open error"
/// from `socket()`, "tcp connect error" from `connect()`), which wraps the `io::Error`; a
/// name lookup that failed the same way (`getaddrinfo`'s `EAI_SYSTEM`) carries the errno
/// likewise. The errors that mean "this process or host is out of something":
/// `EMFILE` (the process's open-file limit), `ENFILE` (the system's file table), `ENOBUFS`
/// (socket buffers) and `ENOMEM` (kernel memory).
pub fn local_shortage(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        let io = e.downcast_ref::<std::io::Error>();
        if let Some(what) = io.and_then(std::io::Error::raw_os_error).and_then(shortage) {
            return Some(what);
        }
        // An `io::Error` that wraps another error answers `source()` with the wrapped
        // error's source, skipping the wrapped error itself: step into it instead.
        cause = match io.and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The local shortage an OS error number names, if it names one.
fn shortage(errno: i32) -> Option<&'static str> {
    #[cfg(unix)]
    {
        match errno {
            libc::EMFILE => Some("open files (EMFILE: the process's open-file limit)"),
            libc::ENFILE => Some("open files (ENFILE: the system's file table is full)"),
            libc::ENOBUFS => Some("socket buffers (ENOBUFS)"),
            libc::ENOMEM => Some("kernel memory (ENOMEM)"),
            _ => None,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = errno;
        None
    }
}
