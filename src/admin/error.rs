//! `AdminError`: what the admin surface tells a person or a script. Handlers return it;
//! `guard` (for everything behind a session) and `login` (before one) turn it once into the
//! answer the caller can use: JSON under `/admin/api/`, an htmx fragment aimed at the flash
//! area for htmx requests, otherwise a page (or, for a missing session, a redirect to login).

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::auth::password::PasswordError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("Sign in to continue.")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("Not found.")]
    NotFound,
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("Too many wrong passwords. Try again in {}.", crate::error::seconds(*.retry_after))]
    Throttled { retry_after: u64 },
    /// Every password-hashing permit stayed taken (`auth::password::Passwords`).
    #[error("Too many passwords are being checked right now. Try again in {}.", crate::error::seconds(*.retry_after))]
    Busy { retry_after: u64 },
    #[error("The request was too large.")]
    TooLarge,
    /// A body in a type the route does not read.
    #[error("{0}")]
    Unsupported(String),
    #[error("The admin surface hit an internal error; nothing was changed.")]
    Internal,
}

impl AdminError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        AdminError::Invalid(msg.into())
    }

    pub fn read_only() -> Self {
        AdminError::Forbidden("Your role can read but not change anything.".into())
    }

    pub fn code(&self) -> &'static str {
        match self {
            AdminError::Unauthorized => "unauthorized",
            AdminError::Forbidden(_) => "forbidden",
            AdminError::NotFound => "not_found",
            AdminError::Invalid(_) => "invalid_request",
            AdminError::Conflict(_) => "conflict",
            AdminError::Throttled { .. } => "too_many_attempts",
            AdminError::Busy { .. } => "busy",
            AdminError::TooLarge => "request_too_large",
            AdminError::Unsupported(_) => "unsupported_media_type",
            AdminError::Internal => "internal_error",
        }
    }

    /// The JSON shape of the admin API.
    pub fn json(&self) -> HttpResponse {
        let mut r = self.base();
        r.content_type("application/json")
            .body(json!({"error": {"code": self.code(), "message": self.to_string()}}).to_string())
    }

    /// An htmx fragment: a message swapped into the page's flash area.
    pub fn fragment(&self) -> HttpResponse {
        let mut r = self.base();
        if matches!(self, AdminError::Unauthorized) {
            r.insert_header(("HX-Redirect", "/admin/login"));
        }
        r.insert_header(("HX-Retarget", "#flash"))
            .insert_header(("HX-Reswap", "innerHTML"))
            .content_type("text/html; charset=utf-8")
            .body(format!(
                "<p class=\"flash error\" role=\"alert\">{}</p>",
                escape(&self.to_string())
            ))
    }

    /// A whole page; a missing session sends the browser to the login form instead.
    pub fn page(&self) -> HttpResponse {
        if matches!(self, AdminError::Unauthorized) {
            return HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/admin/login"))
                .finish();
        }
        let title = match self.status_code().as_u16() {
            403 => "Not allowed",
            404 => "Not found",
            429 => "Slow down",
            500 => "Something went wrong",
            _ => "Cannot do that",
        };
        self.base().content_type("text/html; charset=utf-8").body(format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{title} · Sluice</title><link rel=\"stylesheet\" href=\"/admin/static/admin.css\"></head>\
             <body class=\"plain\"><main id=\"main\" class=\"narrow\"><h1>{title}</h1><p class=\"flash error\" role=\"alert\">{}</p>\
             <p><a href=\"/admin/\">Back to the dashboard</a></p></main></body></html>",
            escape(&self.to_string())
        ))
    }

    fn base(&self) -> actix_web::HttpResponseBuilder {
        let mut r = HttpResponse::build(self.status_code());
        if let AdminError::Throttled { retry_after } | AdminError::Busy { retry_after } = self {
            if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                r.insert_header((header::RETRY_AFTER, v));
            }
        }
        r
    }
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        match self {
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NotFound => StatusCode::NOT_FOUND,
            AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Throttled { .. } | AdminError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            AdminError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            AdminError::Unsupported(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AdminError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Only reached where no edge re-renders the error (it always does); JSON is the safe default.
    fn error_response(&self) -> HttpResponse {
        self.json()
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => AdminError::NotFound,
            StoreError::Conflict(m) => AdminError::Conflict(m),
            StoreError::Invalid(m) => AdminError::invalid(m),
            other => {
                tracing::error!(error = %other, "admin store error");
                AdminError::Internal
            }
        }
    }
}

impl From<askama::Error> for AdminError {
    fn from(e: askama::Error) -> Self {
        tracing::error!(error = %e, "admin template error");
        AdminError::Internal
    }
}

impl From<PasswordError> for AdminError {
    fn from(e: PasswordError) -> Self {
        match e {
            PasswordError::Length => AdminError::Invalid(e.to_string()),
            PasswordError::Hash => AdminError::Internal,
            PasswordError::Busy { retry_after } => AdminError::Busy { retry_after },
        }
    }
}

/// HTML-escapes text for the few fragments built without a template.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
