//! The sign-in form under attack (CHECKS S6, S10), against real gateway processes so that
//! memory is the process's own (`/proc/<pid>/status`) and `/metrics` counts only its
//! argon2 verifications: 40 parallel wrong passwords on one pre-session (on one process,
//! and split over two on one database), and 20 parallel sign-ins on 20 names, which pass
//! the throttle and meet the hashing bound instead; in-process, the busy answer itself.

use reqwest::header::HeaderMap;
use sluice::mock::{MockConfig, MockServer};

use crate::admin_helpers::{
    client, cookie_value, login_form_at, post_login_at, set_cookies, PASSWORD,
};
use crate::helpers::*;
use crate::processes::{start_gateway_full, Gateway};

/// The gateway's own metric of argon2 verifications run (unknown users included).
pub(crate) const VERIFICATIONS: &str = "gateway_password_verifications_total";

/// One argon2id computation holds 19 MiB (OWASP's parameters, `auth::password`).
const ARGON2_KIB: u64 = 19 * 1024;

/// A gateway process whose clock is read from a file (libfaketime), so a test can move it
/// past the throttle's window while the process keeps running.
pub(crate) struct Rig {
    pub dir: tempfile::TempDir,
    pub mock: MockServer,
    pub gateway: Gateway,
    pub db: sluice::store::Db,
    pub http: reqwest::Client,
}

impl Rig {
    pub async fn start() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
        let clock = dir.path().join("faketime");
        std::fs::write(&clock, "+0\n").unwrap();
        let lib = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
            .iter()
            .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1"))
            .find(|p| std::path::Path::new(p).exists())
            .expect("libfaketime (Debian's faketime package; scripts/test-deps.sh installs it)");
        let clock = clock.display().to_string();
        let env = [
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME_TIMESTAMP_FILE", clock.as_str()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ];
        let gateway = start_gateway_full(dir.path(), &mock, &env, "").await;
        let db = crate::gateway_proc::open_dir_db(dir.path()).await;
        sluice::cli::admin_create(
            &db,
            "root",
            "admin",
            None,
            PASSWORD.into(),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
        Rig {
            dir,
            mock,
            gateway,
            db,
            http: client(),
        }
    }

    /// Moves the gateway's clock `seconds` ahead of the real one (a whole new file renamed
    /// into place: libfaketime re-reads it on every clock call and never sees half of it).
    pub fn set_clock_ahead(&self, seconds: i64) {
        let next = self.dir.path().join("faketime.next");
        std::fs::write(&next, format!("+{seconds}\n")).unwrap();
        std::fs::rename(&next, self.dir.path().join("faketime")).unwrap();
    }

    pub fn url(&self) -> &str {
        &self.gateway.url
    }

    /// A second gateway process on the same database file (the real clock).
    pub async fn second(&self) -> Gateway {
        start_gateway_full(self.dir.path(), &self.mock, &[], "").await
    }

    /// A field of `/proc/<gateway pid>/status` in KiB (`VmHWM`: peak resident memory).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.gateway.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc status"))
    }

    /// The counter's value on `/metrics`; the metric must be there (0 before any sign-in).
    pub async fn verifications(&self) -> u64 {
        verifications_of(&self.http, self.url()).await
    }

    /// The sign-in form: (pre-session cookie value, its CSRF token).
    pub async fn form(&self) -> (String, String) {
        login_form_at(&self.http, self.url()).await
    }
}

pub(crate) async fn verifications_of(http: &reqwest::Client, url: &str) -> u64 {
    let text = get_text(http, format!("{url}/metrics")).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{VERIFICATIONS} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("{VERIFICATIONS} missing from /metrics"))
}

pub(crate) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

pub(crate) async fn sign_in(
    http: &reqwest::Client,
    url: &str,
    (pre, csrf): (&str, &str),
    user: &str,
    password: &str,
) -> Answer {
    let r = post_login_at(
        http,
        url,
        &format!("sluice_login={pre}"),
        csrf,
        user,
        password,
    )
    .await;
    Answer {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        body: r.text().await.unwrap(),
    }
}

/// A refused sign-in is the sign-in form again, with the reason and when to come back.
fn assert_throttled_form(a: &Answer) {
    assert_eq!(a.status, 429, "{}", a.body);
    let retry = retry_after(&a.headers);
    // At most the window, rounded up: a parallel attempt stamped a few ms after this one
    // read its clock counts until its own time plus the window (`auth::throttle`), 901 s.
    assert!((1..=901).contains(&retry), "Retry-After {retry}");
    assert!(
        a.body.contains("name=\"csrf_token\""),
        "the form: {}",
        a.body
    );
    assert!(a.body.contains("Try again in"), "the reason: {}", a.body);
    assert!(set_cookies(&a.headers)
        .iter()
        .all(|c| !c.starts_with("sluice_session=")));
}

/// S10: 40 wrong passwords at once on one pre-session. Peak memory stays within a few
/// argon2 computations (the old code ran all 40 at once: 40 × 19 MiB), `/v1` answers
/// throughout, only the throttle's 5 guesses are evaluated, and the right password is
/// refused until the window has passed — then accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_parallel_wrong_passwords_on_one_pre_session() {
    let rig = Rig::start().await;
    let token = sluice::cli::token_issue(&rig.db, &issue_args("dev"), chrono::Utc::now())
        .await
        .unwrap()
        .text;
    let form = rig.form().await;
    assert_eq!(rig.verifications().await, 0);
    let base = rig.status_kib("VmHWM");

    let attack: Vec<_> = (0..40)
        .map(|i| {
            let (http, url, form) = (rig.http.clone(), rig.url().to_string(), form.clone());
            tokio::spawn(async move {
                let guess = format!("wrong guess number {i}");
                sign_in(&http, &url, (&form.0, &form.1), "root", &guess).await
            })
        })
        .collect();
    // Developers keep calling /v1 while the form is hammered.
    let v1 = {
        let (http, url) = (reqwest::Client::new(), rig.url().to_string());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..10 {
                let r = http
                    .post(format!("{url}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .json(&chat_body(50))
                    .send()
                    .await
                    .expect("/v1 answers during the attack");
                statuses.push(r.status().as_u16());
            }
            statuses
        })
    };
    let mut answers = Vec::new();
    for t in attack {
        answers.push(t.await.unwrap());
    }
    let v1 = v1.await.unwrap();
    assert_eq!(v1, vec![200; 10], "/v1 kept serving");

    let wrong = answers.iter().filter(|a| a.status == 401).count();
    assert!(wrong <= 5, "{wrong} guesses answered as wrong");
    for a in answers.iter().filter(|a| a.status != 401) {
        assert_throttled_form(a);
    }
    let evaluated = rig.verifications().await;
    assert!(
        evaluated <= 5,
        "{evaluated} passwords verified; the throttle allows 5"
    );
    assert_eq!(
        evaluated as usize, wrong,
        "one verification per wrong answer"
    );
    let peak = rig.status_kib("VmHWM");
    // Bounded hashing keeps at most 4 argon2 computations alive (76 MiB); allow twice that
    // for the allocator's slack. The old code's 40 at once need 760 MiB.
    assert!(
        peak.saturating_sub(base) < 8 * ARGON2_KIB,
        "peak RSS grew by {} MiB during the attack (from {} MiB)",
        peak.saturating_sub(base) / 1024,
        base / 1024
    );

    let right = sign_in(&rig.http, rig.url(), (&form.0, &form.1), "root", PASSWORD).await;
    assert_throttled_form(&right);
    rig.set_clock_ahead(14 * 60);
    let right = sign_in(&rig.http, rig.url(), (&form.0, &form.1), "root", PASSWORD).await;
    assert_throttled_form(&right);
    assert_eq!(
        rig.verifications().await,
        evaluated,
        "refused attempts are never verified"
    );
    rig.set_clock_ahead(16 * 60);
    let right = sign_in(&rig.http, rig.url(), (&form.0, &form.1), "root", PASSWORD).await;
    assert_eq!(right.status, 303, "{}", right.body);
    assert!(cookie_value(&set_cookies(&right.headers), "sluice_session").is_some());
}

/// Spraying from one address: 20 sign-ins on 20 different names at once all pass the
/// throttle (5 per name, 20 per address), so only the hashing bound stands between them
/// and memory. Each is either verified (401) or told the gateway is busy (429, the form
/// again, nothing counted against the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_names_at_once_meet_the_hashing_bound() {
    let rig = Rig::start().await;
    let form = rig.form().await;
    let base = rig.status_kib("VmHWM");
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (http, url, form) = (rig.http.clone(), rig.url().to_string(), form.clone());
            tokio::spawn(async move {
                let user = if i == 0 {
                    "root".to_string()
                } else {
                    format!("guess{i}")
                };
                sign_in(&http, &url, (&form.0, &form.1), &user, "Summer2026!Summer").await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let wrong = answers.iter().filter(|a| a.status == 401).count();
    for a in answers.iter().filter(|a| a.status != 401) {
        assert_eq!(a.status, 429, "{}", a.body);
        assert!(a.headers.contains_key("retry-after"));
        assert!(a.body.contains("name=\"csrf_token\""), "{}", a.body);
    }
    assert!(wrong >= 1, "at least one was verified");
    assert_eq!(rig.verifications().await as usize, wrong);
    let peak = rig.status_kib("VmHWM");
    assert!(
        peak.saturating_sub(base) < 8 * ARGON2_KIB,
        "peak RSS grew by {} MiB (the old code ran 20 argon2 at once: 380 MiB)",
        peak.saturating_sub(base) / 1024
    );
}

/// The throttle's count lives in the database: two gateway processes on one SQLite file,
/// 40 wrong passwords at once split between them, are 5 guesses together, not 5 each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_database_admit_five_guesses_together() {
    let rig = Rig::start().await;
    let other = rig.second().await;
    let urls = [rig.url().to_string(), other.url.clone()];
    let forms = [rig.form().await, login_form_at(&rig.http, &other.url).await];
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (http, url, form) = (rig.http.clone(), urls[i % 2].clone(), forms[i % 2].clone());
            tokio::spawn(async move {
                let guess = format!("wrong guess number {i}");
                sign_in(&http, &url, (&form.0, &form.1), "root", &guess).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let wrong = answers.iter().filter(|a| a.status == 401).count();
    assert!(
        wrong <= 5,
        "{wrong} guesses answered as wrong over two processes"
    );
    for a in answers.iter().filter(|a| a.status != 401) {
        assert_throttled_form(a);
    }
    let verified = rig.verifications().await + verifications_of(&rig.http, &other.url).await;
    assert_eq!(verified as usize, wrong);
    for url in &urls {
        let form = login_form_at(&rig.http, url).await;
        let right = sign_in(&rig.http, url, (&form.0, &form.1), "root", PASSWORD).await;
        assert_throttled_form(&right);
    }
}

/// When every hashing permit stays taken (a flood of sign-ins on other names), an attempt
/// waits briefly and then gets the sign-in form again with 429 and `Retry-After` — and,
/// never verified, it does not count against the name: the right password then works.
#[tokio::test]
async fn with_every_hashing_permit_taken_a_sign_in_is_told_to_come_back() {
    let app = spawn_app().await;
    crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = crate::admin_helpers::login_form(&app, &http).await;
    let held = app.state.passwords.occupy().await.expect("permits");
    let busy = sign_in(&http, &app.address, (&pre, &csrf), "root", PASSWORD).await;
    assert_eq!(busy.status, 429, "{}", busy.body);
    assert!(busy.headers.contains_key("retry-after"));
    assert!(busy.body.contains("name=\"csrf_token\""), "{}", busy.body);
    assert!(
        busy.body.contains("Too many passwords are being checked"),
        "{}",
        busy.body
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM login_failures").await,
        0,
        "an attempt never verified is withdrawn"
    );
    drop(held);
    let ok = sign_in(&http, &app.address, (&pre, &csrf), "root", PASSWORD).await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM login_failures").await, 0);
}

/// A real gateway whose clock ran an hour ahead took five wrong guesses at `root`; its
/// clock then steps back to the right time. `root` stays locked until those guesses leave
/// the window by their own stamps — and `Retry-After` says so: with the clock moved on by
/// exactly that, the right password signs in (the old answer, 900 s, sent the admin back to
/// be refused again for an hour).
#[tokio::test]
async fn after_a_clock_step_back_retry_after_is_the_real_wait() {
    let rig = Rig::start().await;
    rig.set_clock_ahead(3600);
    let form = rig.form().await;
    for i in 0..5 {
        let a = sign_in(
            &rig.http,
            rig.url(),
            (&form.0, &form.1),
            "root",
            &format!("wrong {i}"),
        )
        .await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    rig.set_clock_ahead(0);
    let refused = sign_in(&rig.http, rig.url(), (&form.0, &form.1), "root", PASSWORD).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let retry = retry_after(&refused.headers) as i64;
    assert!(
        (3600..=3600 + 900).contains(&retry),
        "Retry-After {retry}: the guesses stamped an hour ahead count for an hour and a window"
    );
    rig.set_clock_ahead(retry + 1);
    let form = rig.form().await;
    let back = sign_in(&rig.http, rig.url(), (&form.0, &form.1), "root", PASSWORD).await;
    assert_eq!(
        back.status, 303,
        "refused after waiting the Retry-After: {}",
        back.body
    );
}

/// Two gateways on one database; `root` is locked by five wrong guesses through the one on
/// the right clock. The other one's clock then runs a day ahead, and a sign-in there (at
/// another name) used to sweep every attempt "older than a day" by its clock — all of the
/// first gateway's, unlocking `root` there.
#[tokio::test]
async fn a_gateway_a_day_ahead_does_not_unlock_names_for_the_others() {
    let rig = Rig::start().await;
    let right = rig.second().await;
    let form = login_form_at(&rig.http, &right.url).await;
    for i in 0..5 {
        let a = sign_in(
            &rig.http,
            &right.url,
            (&form.0, &form.1),
            "root",
            &format!("wrong {i}"),
        )
        .await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    rig.set_clock_ahead(86_400 + 60);
    let ahead = rig.form().await;
    let other = sign_in(
        &rig.http,
        rig.url(),
        (&ahead.0, &ahead.1),
        "nobody",
        "a guess of some length",
    )
    .await;
    assert_eq!(other.status, 401, "{}", other.body);
    let form = login_form_at(&rig.http, &right.url).await;
    let root = sign_in(&rig.http, &right.url, (&form.0, &form.1), "root", PASSWORD).await;
    assert_throttled_form(&root);
}

/// What `root`'s password becomes while a sign-in with the old one is under way.
const REPLACED_BY: &str = "the password that replaced it";

/// Waits until a password computation waits for a hashing permit (all of them held by the
/// test): a sign-in or password change doing so has read its login's row already.
pub(crate) async fn until_one_waits_for_a_permit(app: &TestApp) {
    for _ in 0..400 {
        if app.state.passwords.waiting() > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("nothing came to wait for a hashing permit");
}

/// Signs `root` in with `PASSWORD` and, while that sign-in has read the login and waits to
/// verify it, replaces the password as a change or a reset does (the new hash, every
/// session of the login ended, in one transaction of its own); then lets it go on.
async fn sign_in_across_a_password_change(app: &TestApp, id: i64) -> Answer {
    let http = client();
    let (pre, csrf) = login_form_at(&http, &app.address).await;
    let new_hash = sluice::auth::password::hash(REPLACED_BY).unwrap();
    let held = app.state.passwords.occupy().await.expect("permits");
    let change = async move {
        until_one_waits_for_a_permit(app).await;
        sql_exec(
            app.db(),
            &format!("UPDATE admins SET password_hash = '{new_hash}' WHERE id = {id}"),
        )
        .await;
        sql_exec(
            app.db(),
            &format!("DELETE FROM admin_sessions WHERE admin_id = {id}"),
        )
        .await;
        drop(held);
    };
    let (answer, ()) = tokio::join!(
        sign_in(&http, &app.address, (&pre, &csrf), "root", PASSWORD),
        change
    );
    answer
}

/// Review s21 #1: a sign-in verified against a password that was changed while it waited
/// for a hashing permit got a session after the change had ended every session — an
/// attacker looping sign-ins with a leaked password outlived its change. It is refused as
/// a wrong password is, and no session of the login exists.
#[tokio::test]
async fn a_sign_in_checked_against_a_replaced_password_gets_no_session() {
    let app = spawn_app().await;
    let id = crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let a = sign_in_across_a_password_change(&app, id).await;
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(
        a.body.contains("Invalid username or password."),
        "{}",
        a.body
    );
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM admin_sessions WHERE admin_id = {id}"
        ))
        .await,
        0,
        "no session outlives the change"
    );
    crate::admin_helpers::login_with(&app, "root", REPLACED_BY).await;
}

/// A gateway whose login `root` (its id) has `PASSWORD` hashed with older parameters (4 MiB,
/// one pass): its next sign-in rehashes it.
async fn root_with_an_old_params_hash() -> (TestApp, i64) {
    use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
    let app = spawn_app().await;
    let id = crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let old = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        argon2::Params::new(4096, 1, 1, None).unwrap(),
    )
    .hash_password(PASSWORD.as_bytes(), &SaltString::generate(&mut OsRng))
    .unwrap()
    .to_string();
    sql_exec(
        app.db(),
        &format!("UPDATE admins SET password_hash = '{old}' WHERE id = {id}"),
    )
    .await;
    (app, id)
}

/// Review s21 #1, the worse half: with a hash of older parameters, the sign-in rehashed
/// the old password and wrote it over the new one, undoing the change. The new hash stays.
#[tokio::test]
async fn a_rehash_at_sign_in_never_writes_the_old_password_over_a_new_one() {
    let (app, id) = root_with_an_old_params_hash().await;
    let a = sign_in_across_a_password_change(&app, id).await;
    assert_eq!(a.status, 401, "{}", a.body);
    let stored = sql_text(
        app.db(),
        &format!("SELECT password_hash FROM admins WHERE id = {id}"),
    )
    .await;
    assert!(
        sluice::auth::password::verify(REPLACED_BY, &stored),
        "the new password stands"
    );
    let http = client();
    let form = login_form_at(&http, &app.address).await;
    let again = sign_in(&http, &app.address, (&form.0, &form.1), "root", PASSWORD).await;
    assert_eq!(
        again.status, 401,
        "the old password opens nothing: {}",
        again.body
    );
    crate::admin_helpers::login_with(&app, "root", REPLACED_BY).await;
}

/// Final review F5: two sign-ins of a login whose hash has older parameters, at once —
/// the first rehashes the password; the second, verified against the hash it read before,
/// found the hash changed under it and was refused as a wrong password, though the
/// password is the same. A changed hash is verified again (outside the transaction) before
/// the sign-in is refused: the rehash of the same password lets it in.
#[tokio::test]
async fn a_sign_in_across_another_sign_ins_rehash_still_gets_in() {
    let (app, id) = root_with_an_old_params_hash().await;
    let http = client();
    let (pre, csrf) = login_form_at(&http, &app.address).await;
    // What the other sign-in's rehash writes: the same password, today's parameters.
    let rehashed = sluice::auth::password::hash(PASSWORD).unwrap();
    let held = app.state.passwords.occupy().await.expect("permits");
    let other = async {
        until_one_waits_for_a_permit(&app).await;
        sql_exec(
            app.db(),
            &format!("UPDATE admins SET password_hash = '{rehashed}' WHERE id = {id}"),
        )
        .await;
        drop(held);
    };
    let (a, ()) = tokio::join!(
        sign_in(&http, &app.address, (&pre, &csrf), "root", PASSWORD),
        other
    );
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM admin_sessions WHERE admin_id = {id}"
        ))
        .await,
        1
    );
}

/// Review s21 #6: a failed sign-in wrote the typed username into the audit log, which is
/// never trimmed — a password or token pasted into the wrong field was kept there in clear
/// for good, and anyone could fill the log. A name that is no login is recorded as
/// `(unknown)`; a failed sign-in at a real login still names it. The throttle's counters
/// (`login_failures`, in every backup of their window) keep only the name's MAC.
#[tokio::test]
async fn a_failed_sign_in_keeps_no_typed_text_in_the_audit_log() {
    let app = spawn_app().await;
    crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let http = client();
    let form = login_form_at(&http, &app.address).await;
    let pasted = [
        "sk-sl-0123456789abcdef0123456789abcdef0123456789ab",
        "correct horse battery staple",
    ];
    for name in pasted {
        let a = sign_in(
            &http,
            &app.address,
            (&form.0, &form.1),
            name,
            "whatever it is",
        )
        .await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    let a = sign_in(
        &http,
        &app.address,
        (&form.0, &form.1),
        "root",
        "a wrong password",
    )
    .await;
    assert_eq!(a.status, 401, "{}", a.body);
    type Row = (
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = sql_rows(
        app.db(),
        "SELECT actor, address, action, target, before, after FROM audit_log ORDER BY id",
    )
    .await;
    let all = format!("{rows:?}");
    for name in pasted {
        assert!(!all.contains(name), "{name} is kept: {all}");
    }
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.2 == "login.failed")
        .map(|r| r.0.as_str())
        .collect();
    assert_eq!(failed, ["(unknown)", "(unknown)", "root"]);
    // Nor does the throttle's counter keep it: a name counts under its MAC.
    let keys: Vec<(String,)> = sql_rows(app.db(), "SELECT key FROM login_failures").await;
    let keys = format!("{keys:?}");
    for name in pasted.iter().chain(&["root"]) {
        assert!(!keys.contains(name), "{name} is kept: {keys}");
    }
}
