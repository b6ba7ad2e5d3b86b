//! What every page shares: the chrome (who is signed in, their CSRF token, which menu entry
//! is current), the HTML response helpers, template filters, and parsing of the amounts and
//! times people type.

use actix_web::HttpResponse;
use askama::Template;
use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc};

use super::actor::{Actor, Role};
use super::error::AdminError;
use crate::quota::pricing;

/// The part of every page around its content.
pub struct Chrome {
    pub username: String,
    pub role: &'static str,
    pub csrf: String,
    pub active: &'static str,
    pub can_write: bool,
    pub is_admin: bool,
    pub is_lead: bool,
}

impl Chrome {
    pub fn new(actor: &Actor, active: &'static str) -> Chrome {
        Chrome {
            username: actor.username.clone(),
            role: actor.role.as_str(),
            csrf: actor.csrf().to_string(),
            active,
            can_write: actor.can_write(),
            is_admin: actor.role == Role::Admin,
            is_lead: actor.role == Role::Lead,
        }
    }

    /// `aria-current` for the menu entry of this page.
    pub fn current(&self, name: &str) -> &'static str {
        if self.active == name {
            "page"
        } else {
            "false"
        }
    }
}

pub fn html<T: Template>(t: &T) -> Result<HttpResponse, AdminError> {
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(t.render()?))
}

/// A fragment plus a message for the flash area (an out-of-band htmx swap).
pub fn html_with_flash<T: Template>(t: &T, message: &str) -> Result<HttpResponse, AdminError> {
    let body = format!(
        "{}<div id=\"flash\" hx-swap-oob=\"innerHTML\"><p class=\"flash ok\" role=\"status\">{}</p></div>",
        t.render()?,
        super::error::escape(message)
    );
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(body))
}

pub mod filters {
    //! Template filters: `{{ x|usd }}`, `{{ x|opt }}`.
    use std::fmt::Display;

    pub trait Micros {
        fn micros(&self) -> Option<i64>;
    }
    impl Micros for i64 {
        fn micros(&self) -> Option<i64> {
            Some(*self)
        }
    }
    impl Micros for Option<i64> {
        fn micros(&self) -> Option<i64> {
            *self
        }
    }
    impl<T: Micros + ?Sized> Micros for &T {
        fn micros(&self) -> Option<i64> {
            (**self).micros()
        }
    }

    /// Micro-dollars as `$1.234567`; no amount as "unlimited".
    pub fn usd(v: impl Micros, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(match v.micros() {
            Some(m) => format!("${}", crate::quota::pricing::usd(m)),
            None => "unlimited".into(),
        })
    }

    /// Micro-dollars as a plain USD amount for an input's value; none as empty.
    pub fn amount(v: impl Micros, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(v.micros()
            .map(crate::quota::pricing::usd)
            .unwrap_or_default())
    }

    pub trait Maybe {
        fn text(&self) -> Option<String>;
    }
    impl<T: Display> Maybe for Option<T> {
        fn text(&self) -> Option<String> {
            self.as_ref().map(|v| v.to_string())
        }
    }
    impl<T: Maybe + ?Sized> Maybe for &T {
        fn text(&self) -> Option<String> {
            (**self).text()
        }
    }

    /// An optional value, or nothing (for an input's value).
    pub fn blank(v: impl Maybe, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(v.text().unwrap_or_default())
    }

    /// An optional value, or an em dash.
    pub fn opt(v: impl Maybe, _: &dyn askama::Values) -> askama::Result<String> {
        Ok(v.text().unwrap_or_else(|| "—".into()))
    }
}

/// A USD amount typed by a person (`12.50`), as micro-dollars.
pub fn parse_usd(field: &str, s: &str) -> Result<i64, AdminError> {
    pricing::parse_usd(s).ok_or_else(|| {
        AdminError::invalid(format!("{field}: `{s}` is not a USD amount like 12.50"))
    })
}

pub fn opt_usd(field: &str, s: Option<&str>) -> Result<Option<i64>, AdminError> {
    s.map(|s| parse_usd(field, s)).transpose()
}

/// An expiry: RFC 3339 (API), or a `datetime-local` value plus the browser's offset from
/// UTC in minutes as JavaScript's `getTimezoneOffset()` gives it (UI).
pub fn parse_expiry(s: &str, tz_offset_minutes: Option<i64>) -> Result<DateTime<Utc>, AdminError> {
    let t = expiry_instant(s, tz_offset_minutes)?;
    if !crate::clock::storable(t) {
        // Stored as `+10000-…`, it would read as expired to the ledger and as never expiring
        // to the auth cache (s26 attack admin #6).
        return Err(AdminError::invalid(format!(
            "expires: `{s}` is not within the years 0000 to 9999"
        )));
    }
    Ok(t)
}

fn expiry_instant(s: &str, tz_offset_minutes: Option<i64>) -> Result<DateTime<Utc>, AdminError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let local = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M")
        .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S"))
        .map_err(|_| AdminError::invalid(format!("expires: `{s}` is not a date and time")))?;
    let offset = tz_offset_minutes.unwrap_or(0);
    let out_of_range = || {
        AdminError::invalid(format!(
            "tz_offset: `{offset}` is not an offset from UTC in minutes within a day"
        ))
    };
    // A range, not `abs()`: `i64::MIN` has no absolute value (a panic, or in a release
    // build a negative that passed the check and panicked in `Duration::minutes`).
    if !(-24 * 60..=24 * 60).contains(&offset) {
        return Err(out_of_range());
    }
    // Checked: a time at the very end of chrono's calendar moved by a day leaves its range.
    Utc.from_utc_datetime(&local)
        .checked_add_signed(Duration::minutes(offset))
        .ok_or_else(out_of_range)
}

/// `YYYY-MM` → the month's first instant and the next month's, as database times.
pub fn month_range(month: &str) -> Result<(NaiveDate, String, String), AdminError> {
    let shaped = month.len() == 7
        && month.bytes().enumerate().all(|(i, b)| {
            if i == 4 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    if !shaped {
        return Err(AdminError::invalid(format!(
            "month: `{month}` is not YYYY-MM"
        )));
    }
    let first = NaiveDate::parse_from_str(&format!("{month}-01"), "%Y-%m-%d")
        .map_err(|_| AdminError::invalid(format!("month: `{month}` is not YYYY-MM")))?;
    let next = first
        .checked_add_months(chrono::Months::new(1))
        .ok_or_else(|| AdminError::invalid("month out of range"))?;
    Ok((first, day_start(first), day_start(next)))
}

/// A UTC date's first instant as a database time.
pub fn day_start(d: NaiveDate) -> String {
    crate::clock::db_time(Utc.from_utc_datetime(&d.and_time(chrono::NaiveTime::MIN)))
}

/// `YYYY-MM-DD` with a four-digit year. chrono's `%Y` alone also takes a signed year of any
/// width (`+262142-12-31`): a date whose next day overflows (a panic), and which `db_time`
/// writes as `+…` text that sorts before every real time (s26 attack admin #1).
pub fn parse_date(field: &str, s: &str) -> Result<NaiveDate, AdminError> {
    let shaped = s.len() == 10 && s.as_bytes().first().is_some_and(u8::is_ascii_digit);
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .filter(|_| shaped)
        .ok_or_else(|| AdminError::invalid(format!("{field}: `{s}` is not a date (YYYY-MM-DD)")))
}

/// Usernames and team names: letters, digits, `.`, `_`, `-`, 1 to 64 characters.
pub fn check_name(field: &str, s: &str) -> Result<(), AdminError> {
    let ok = (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AdminError::invalid(format!(
            "{field}: 1 to 64 letters, digits, `.`, `_` or `-`"
        )))
    }
}

/// How full a budget is, 0..=100, for the spend bars.
pub fn percent(spent: i64, limit: Option<i64>) -> i64 {
    match limit {
        Some(l) if l > 0 => (spent.max(0).saturating_mul(100) / l).min(100),
        Some(_) => 100,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_from_a_browser_zone() {
        // UTC+2 (getTimezoneOffset = -120): 12:00 local is 10:00 UTC.
        let t = parse_expiry("2026-12-01T12:00", Some(-120)).unwrap();
        assert_eq!(crate::clock::db_time(t), "2026-12-01T10:00:00.000Z");
        let t = parse_expiry("2026-12-01T12:00:00Z", None).unwrap();
        assert_eq!(crate::clock::db_time(t), "2026-12-01T12:00:00.000Z");
        assert!(parse_expiry("tomorrow", None).is_err());
    }

    #[test]
    fn months_and_names() {
        let (_, a, b) = month_range("2026-12").unwrap();
        assert_eq!(a, "2026-12-01T00:00:00.000Z");
        assert_eq!(b, "2027-01-01T00:00:00.000Z");
        assert!(month_range("2026-13").is_err());
        assert!(month_range("2026-1").is_err());
        assert!(check_name("username", "alice.b-1").is_ok());
        assert!(check_name("username", "a b").is_err());
        assert!(check_name("username", "' OR 1=1 --").is_err());
        assert_eq!(percent(50, Some(200)), 25);
        assert_eq!(percent(500, Some(200)), 100);
    }
}
