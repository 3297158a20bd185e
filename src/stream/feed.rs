//! Where a stream's lines come from.

use crate::kubeapi::{self, ApiError};

/// What a stream reads its lines from: a watch of its own, or its part of a fanned-out
/// collection's hub.
pub(super) enum Feed {
    Api(kubeapi::Watch),
    Fanned(crate::fanout::Subscription),
}

impl Feed {
    /// The next complete line; `Ok(None)` at a clean end.
    pub(super) async fn next_line(&mut self) -> Result<Option<bytes::Bytes>, ApiError> {
        match self {
            Feed::Api(w) => w.next_line().await,
            Feed::Fanned(s) => Ok(s.next_line().await),
        }
    }

    /// A line already received, if any.
    pub(super) fn buffered_line(&mut self) -> Option<bytes::Bytes> {
        match self {
            Feed::Api(w) => w.buffered_line(),
            Feed::Fanned(s) => s.buffered_line(),
        }
    }
}
