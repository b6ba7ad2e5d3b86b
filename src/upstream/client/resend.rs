//! Which failed calls the upstream never had, so `post` sends them again: those HTTP/2 says
//! it did not process (`unprocessed`) and those hyper gave up before they went
//! (`never_sent`).

use std::time::Duration;

use crate::upstream::on_wire;

/// How many times a request the upstream did not process (`unprocessed`, `never_sent`) is
/// sent again within one attempt: reqwest's own retry's figure.
pub(super) const RESENDS: usize = 2;

/// The pause before the n-th resend is n times this.
pub(super) const RESEND_PAUSE: Duration = Duration::from_millis(10);

/// How HTTP/2 said the upstream did not process a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unprocessed {
    /// A graceful GOAWAY (`NO_ERROR`) for a stream past its last.
    GoneAway,
    /// The stream refused (`REFUSED_STREAM`, RFC 9113 §8.7): the server sheds load.
    Refused,
}

/// Whether `err` says, by HTTP/2's word, that the upstream did not process the request —
/// what reqwest's own retry resends, and cannot for a body it is not given whole
/// (`on_wire::watched`).
pub(super) fn unprocessed(err: &(dyn std::error::Error + 'static)) -> Option<Unprocessed> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            return match h2.is_remote() {
                true if h2.is_go_away() && reason == Some(h2::Reason::NO_ERROR) => {
                    Some(Unprocessed::GoneAway)
                }
                true if h2.is_reset() && reason == Some(h2::Reason::REFUSED_STREAM) => {
                    Some(Unprocessed::Refused)
                }
                _ => None,
            };
        }
        cause = e.source();
    }
    None
}

/// Whether a call that failed never sent its request whole, so may be sent again: its body
/// was not read whole, and hyper says it gave the request up before it went — its dispatch
/// gone (a graceful GOAWAY reaching a request it held at the stream cap) or the request
/// canceled (its connection closed before it went). Anything else — a connection not made,
/// a reset, a server pushing back — is the upstream's to answer for, and not resent.
pub(super) fn never_sent(err: &reqwest::Error, wire: &on_wire::Wire) -> bool {
    wire.unsent() && given_up(err)
}

/// Whether `err` is hyper giving a request up before it went (`never_sent`).
fn given_up(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return h.is_user() || h.is_canceled();
        }
        cause = e.source();
    }
    false
}
