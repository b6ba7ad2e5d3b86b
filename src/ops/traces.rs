//! OpenTelemetry traces (DESIGN.md "Traces"): one span per request with a child per stage,
//! exported over OTLP/HTTP (protobuf) in batches from a thread of their own.
//!
//! Off unless `[tracing] otlp_endpoint` is set: then nothing is installed, `Trace::start`
//! is one atomic load, and every stage and attempt is an empty `Option` — no span, no
//! context, no header. Never recorded: prompts, completions, keys, tokens — only what
//! the request log already holds (ids, model names, counts, cost, status).

use std::sync::mpsc::{self, RecvTimeoutError, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use reqwest::header::HeaderValue;

use crate::config::{Provider, TracingSettings};

/// Spans waiting for export at most; past it a span is dropped (and counted), never waited
/// for: a slow or unreachable collector costs the request path nothing.
const QUEUE: usize = 4096;
/// Spans per OTLP request.
const BATCH: usize = 512;
/// A partial batch leaves after this long.
const INTERVAL: Duration = Duration::from_secs(1);
/// One export's time; meanwhile new spans fill the queue.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

static TRACING: OnceLock<Tracing> = OnceLock::new();

struct Tracing {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

/// Starts the exporter when `[tracing] otlp_endpoint` is set (once per process: the
/// setting is read at start, SIGHUP does not change it).
pub fn install(s: &TracingSettings) -> anyhow::Result<()> {
    let Some(url) = s.traces_url() else {
        return Ok(());
    };
    if TRACING.get().is_some() {
        return Ok(());
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let resource = Resource::builder()
        .with_service_name(s.service_name.clone())
        .build();
    // A client's sampled flag decides for its trace; a new trace is kept by its id's ratio.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(s.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Exporting::start(exporter)?)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice");
    // A second install (a test process starting two gateways) keeps the first.
    let _ = TRACING.set(Tracing { tracer, provider });
    Ok(())
}

/// Sends what is queued, waiting at most a few seconds (at shutdown).
pub fn flush() {
    if let Some(t) = TRACING.get() {
        if let Err(e) = t.provider.force_flush() {
            tracing::warn!(error = %e, "trace spans not all delivered at shutdown");
        }
    }
}

/// A request's trace: empty when tracing is off or the request is not sampled. Carried by
/// the request's log row (`RequestRow::trace`), so the span ends where the row is
/// recorded, whichever way the request ended (answered, refused, streamed, departed).
#[derive(Clone, Default)]
pub struct Trace(Option<Arc<Request>>);

struct Request {
    tracer: &'static SdkTracer,
    span: Mutex<Option<Span>>,
    operation: &'static str,
    /// The request span's own, the parent of every stage.
    context: SpanContext,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Trace(on)"
        } else {
            "Trace(off)"
        })
    }
}

impl Trace {
    /// The request's span, a child of the client's `traceparent` when it sent a valid one
    /// (a malformed one is ignored: a new trace).
    #[inline]
    pub fn start(headers: &HeaderMap, operation: &'static str) -> Trace {
        match TRACING.get() {
            None => Trace(None),
            Some(t) => t.request(headers, operation),
        }
    }

    /// A stage's span (`auth`, `window`, `cache`, `queue`, `reserve`, `settle`), ended when
    /// dropped.
    #[inline]
    pub fn stage(&self, name: &'static str) -> Stage {
        Stage(self.0.as_ref().map(|r| r.child(name, SpanKind::Internal)))
    }

    /// One upstream attempt's span: its `traceparent` goes upstream.
    #[inline]
    pub fn attempt(&self, upstream: &str, url: &reqwest::Url) -> Stage {
        let Some(r) = &self.0 else {
            return Stage(None);
        };
        let mut span = r.child("upstream", SpanKind::Client);
        span.set_attribute(KeyValue::new("sluice.upstream", upstream.to_string()));
        if let Some(host) = url.host_str() {
            span.set_attribute(KeyValue::new("server.address", host.to_string()));
        }
        Stage(Some(span))
    }

    /// The output cap asked (or set by the gateway) for.
    #[inline]
    pub fn max_tokens(&self, cap: Option<i64>) {
        if let Some(cap) = cap {
            self.set("gen_ai.request.max_tokens", cap);
        }
    }

    /// The provider and host that served.
    #[inline]
    pub fn served_by(&self, provider: Provider, url: Option<&reqwest::Url>) {
        if self.0.is_none() {
            return;
        }
        let name = provider_name(provider);
        self.set("gen_ai.provider.name", name);
        self.set("gen_ai.system", name);
        if let Some(host) = url.and_then(|u| u.host_str()) {
            self.set("server.address", host.to_string());
        }
    }

    fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(r) = &self.0 {
            if let Some(span) = r.span.lock().as_mut() {
                span.set_attribute(KeyValue::new(key, value));
            }
        }
    }

    /// Ends the request span, named after its operation and model, with its final
    /// attributes (`request_log::trace_attributes`); `error` marks a 5xx. Once: a copy of
    /// the row ends nothing more.
    pub fn finish(&self, model: &str, attributes: Vec<KeyValue>, error: Option<&'static str>) {
        let Some(r) = &self.0 else { return };
        let Some(mut span) = r.span.lock().take() else {
            return;
        };
        span.update_name(format!("{} {model}", r.operation));
        span.set_attribute(KeyValue::new("gen_ai.operation.name", r.operation));
        span.set_attributes(attributes);
        if let Some(code) = error {
            span.set_status(Status::error(code));
        }
        span.end();
    }

    /// Whether the request is traced (its attributes are then worth building).
    #[inline]
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }
}

/// `gen_ai.provider.name`: the semantic conventions' names, ours where they have none.
fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
        Provider::AzureOpenai => "azure.ai.openai",
        Provider::Gemini => "gcp.gemini",
        Provider::Bedrock => "aws.bedrock",
        Provider::OpenaiCompatible => "openai_compatible",
    }
}

/// A stage's (or an attempt's) span; nothing when tracing is off. Ends when dropped.
#[derive(Default)]
pub struct Stage(Option<Span>);

impl Stage {
    #[inline]
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(span) = self.0.as_mut() {
            span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// An upstream attempt's outcome: the HTTP status it answered (if any) and the retry
    /// tier its failure falls in (`served` for a success).
    pub fn outcome(&mut self, status: Option<u16>, tier: &'static str) {
        let Some(span) = self.0.as_mut() else { return };
        if let Some(s) = status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        span.set_attribute(KeyValue::new("sluice.retry_tier", tier));
        if tier != "served" {
            span.set_status(Status::error(tier));
        }
    }

    /// The W3C `traceparent` naming this span, for the upstream request.
    pub fn traceparent(&self) -> Option<HeaderValue> {
        let sc = self.0.as_ref()?.span_context();
        let value = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        HeaderValue::from_str(&value).ok()
    }
}

impl Tracing {
    fn request(&'static self, headers: &HeaderMap, operation: &'static str) -> Trace {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let span = self
            .tracer
            .span_builder("request")
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        if !span.is_recording() {
            return Trace(None);
        }
        let context = span.span_context().clone();
        Trace(Some(Arc::new(Request {
            tracer: &self.tracer,
            span: Mutex::new(Some(span)),
            operation,
            context,
        })))
    }
}

impl Request {
    fn child(&self, name: &'static str, kind: SpanKind) -> Span {
        let tracer = self.tracer;
        let parent = Context::new().with_remote_span_context(self.context.clone());
        tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(tracer, &parent)
    }
}

/// The client's headers as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span processor: ended spans go into a bounded queue (full: dropped and counted,
/// never waited for); a thread of its own batches them to the exporter, so no export
/// runs on the request path's runtime.
#[derive(Debug)]
struct Exporting {
    tx: mpsc::SyncSender<Msg>,
}

enum Msg {
    Span(Box<SpanData>),
    Resource(Resource),
    Flush(mpsc::SyncSender<()>),
}

impl Exporting {
    fn start<E: SpanExporter + 'static>(exporter: E) -> std::io::Result<Exporting> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("sluice-traces".into())
            .spawn(move || export_loop(exporter, rx))?;
        Ok(Exporting { tx })
    }

    /// Sends what is queued and waits up to `timeout` for it to be exported.
    fn flush_within(&self, timeout: Duration) -> OTelSdkResult {
        let (done, wait) = mpsc::sync_channel(1);
        self.tx
            .try_send(Msg::Flush(done))
            .map_err(|_| OTelSdkError::InternalFailure("the export queue is full".into()))?;
        wait.recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for Exporting {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Span(Box::new(span))) {
            spans_dropped("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(EXPORT_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.flush_within(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // The first message: the queue is empty.
        let _ = self.tx.try_send(Msg::Resource(resource.clone()));
    }
}

/// The exporter's thread: a batch leaves when full, after `INTERVAL`, or on a flush.
fn export_loop<E: SpanExporter>(mut exporter: E, rx: mpsc::Receiver<Msg>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "the trace exporter cannot start; spans are dropped");
            return;
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    let mut due = Instant::now() + INTERVAL;
    loop {
        match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Msg::Span(s)) => {
                batch.push(*s);
                if batch.len() < BATCH {
                    continue;
                }
            }
            Ok(Msg::Resource(r)) => {
                exporter.set_resource(&r);
                continue;
            }
            Ok(Msg::Flush(done)) => {
                send(&rt, &exporter, &mut batch);
                let _ = done.send(());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                send(&rt, &exporter, &mut batch);
                return;
            }
        }
        send(&rt, &exporter, &mut batch);
        due = Instant::now() + INTERVAL;
    }
}

/// Counted here, not in `ops::metrics`: the request log row (`store::requests`) carries a
/// `Trace`, so this module must not reach back to what depends on the store.
pub const SPANS_DROPPED: &str = "gateway_trace_spans_dropped_total";

fn spans_dropped(reason: &'static str, n: u64) {
    ::metrics::counter!(SPANS_DROPPED, "reason" => reason).increment(n);
}

fn send<E: SpanExporter>(rt: &tokio::runtime::Runtime, exporter: &E, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
    let n = spans.len() as u64;
    if let Err(e) = rt.block_on(exporter.export(spans)) {
        tracing::debug!(error = %e, spans = n, "trace export failed");
        spans_dropped("export_failed", n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_it_builds_nothing_and_sends_no_traceparent() {
        // No `install` in the unit tests: tracing is off.
        let mut headers = HeaderMap::new();
        headers.insert(
            actix_web::http::header::HeaderName::from_static("traceparent"),
            actix_web::http::header::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        let trace = Trace::start(&headers, "chat");
        assert!(trace.0.is_none());
        let url = reqwest::Url::parse("http://up.example/v1").expect("a literal URL");
        let attempt = trace.attempt("up", &url);
        assert!(attempt.traceparent().is_none());
        assert!(trace.stage("auth").0.is_none());
    }

    /// An exporter that reports each batch's size, or never finishes (`stuck`).
    #[derive(Debug)]
    struct Probe {
        sizes: std::sync::Mutex<mpsc::Sender<usize>>,
        stuck: bool,
    }

    impl SpanExporter for Probe {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let _ = self.sizes.lock().map(|tx| tx.send(batch.len()));
            if self.stuck {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }

    fn ended() -> SpanData {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes([1; 16]),
                SpanId::from_bytes([2; 8]),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "stage".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    fn probe(stuck: bool) -> (Exporting, mpsc::Receiver<usize>) {
        let (tx, rx) = mpsc::channel();
        let sizes = std::sync::Mutex::new(tx);
        let exporting = Exporting::start(Probe { sizes, stuck }).expect("a thread starts");
        (exporting, rx)
    }

    #[test]
    fn spans_leave_in_full_batches_and_the_rest_within_the_interval() {
        let (exporting, sizes) = probe(false);
        for _ in 0..BATCH + 88 {
            exporting.on_end(ended());
        }
        let wait = INTERVAL * 3;
        assert_eq!(sizes.recv_timeout(wait), Ok(BATCH));
        assert_eq!(sizes.recv_timeout(wait), Ok(88));
    }

    #[test]
    fn a_stuck_exporter_never_holds_up_an_ended_span() {
        let (exporting, sizes) = probe(true);
        let started = Instant::now();
        // The first batch takes the exporter forever; the queue fills, then drops.
        for _ in 0..BATCH + 2 * QUEUE {
            exporting.on_end(ended());
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(sizes.recv_timeout(INTERVAL * 3), Ok(BATCH));
    }
}
