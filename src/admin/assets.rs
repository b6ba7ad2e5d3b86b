//! The admin UI's static files (`static/`: htmx pinned, admin.css, admin.js), embedded in
//! the binary with rust-embed (also in debug builds), so the UI needs no network.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "static/"]
struct Static;

pub async fn serve(file: web::Path<String>) -> HttpResponse {
    let name = file.into_inner();
    let Some(f) = Static::get(&name) else {
        return HttpResponse::NotFound().finish();
    };
    let mime = match name.rsplit('.').next() {
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    };
    let etag = format!("\"{}\"", hex::encode(&f.metadata.sha256_hash()[..8]));
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, mime))
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .insert_header(("x-content-type-options", "nosniff"))
        .body(f.data.into_owned())
}
