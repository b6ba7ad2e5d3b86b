//! The admin surface: the web UI under `/admin` (askama pages, htmx partial updates, assets
//! embedded in the binary) and the JSON API under `/admin/api/v1`. Each page's module holds
//! the operations themselves (with the permission checks, the audit row and the transaction)
//! and thin HTML handlers; `api` maps the same operations to JSON, so both surfaces share one
//! implementation. `guard` authenticates and refuses cross-site requests for everything but
//! the login form and the static files.

pub mod account;
pub mod actor;
pub mod api;
pub mod assets;
pub mod audit;
pub mod cache;
pub mod dashboard;
pub mod error;
pub mod finance;
pub mod guard;
pub mod input;
pub mod login;
pub mod oidc;
pub mod price_ops;
pub mod reports;
pub mod requests;
pub mod teams;
pub mod token_ops;
pub mod tokens;
pub mod upstream_ops;
pub mod upstreams;
pub mod user_ops;
pub mod users;
pub mod view;

use actix_web::middleware::from_fn;
use actix_web::{web, HttpResponse};

pub use actor::{Actor, Role};
pub use error::AdminError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/login", web::get().to(login::form))
        .route("/admin/login", web::post().to(login::submit))
        .route("/admin/static/{file}", web::get().to(assets::serve))
        .configure(oidc::configure)
        .service(
            web::scope("/admin")
                .wrap(from_fn(guard::guard))
                // A path value that cannot be read (`/teams/abc`) is the admin's 400 in the
                // caller's format, naming it — actix's own was a plain-text 404 (s32 edge
                // attack F3).
                .app_data(
                    web::PathConfig::default()
                        .error_handler(|e, _| AdminError::invalid(format!("path: {e}")).into()),
                )
                .configure(api::configure)
                .route("", web::get().to(redirect_home))
                .route("/", web::get().to(dashboard::page))
                .route("/dashboard/stats", web::get().to(dashboard::stats))
                .route("/logout", web::post().to(login::logout))
                .configure(teams::configure)
                .configure(users::configure)
                .configure(tokens::configure)
                .route("/requests", web::get().to(requests::page))
                .route("/reports", web::get().to(reports::page))
                .route("/reports.csv", web::get().to(reports::csv))
                .route("/audit", web::get().to(audit::page))
                .route("/finance", web::get().to(finance::page))
                .route("/audit/verify", web::get().to(audit::verify))
                .route("/upstreams", web::get().to(upstreams::page))
                .route("/upstreams", web::post().to(upstreams::add_html))
                .route("/models", web::post().to(upstreams::model_html))
                .route(
                    "/upstreams/{id}/rotate",
                    web::post().to(upstreams::rotate_html),
                )
                .route("/upstreams/{id}/test", web::post().to(upstreams::test_html))
                .route(
                    "/upstreams/{id}/delete",
                    web::post().to(upstreams::delete_html),
                )
                .route(
                    "/upstreams/{id}/{action}",
                    web::post().to(upstreams::toggle),
                )
                .configure(account::configure)
                .default_service(web::to(not_found)),
        );
}

async fn redirect_home() -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header(("location", "/admin/"))
        .finish()
}

/// Anything under `/admin` that is not a route: behind the guard, so only a signed-in caller
/// ever learns that it does not exist.
async fn not_found() -> Result<HttpResponse, AdminError> {
    Err(AdminError::NotFound)
}
